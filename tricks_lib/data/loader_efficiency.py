"""How close a data loader comes to the ideal of every core working as fast as one core alone.

:func:`pipeline_efficiency` reads a ``compare(...)`` of loading pipelines (samples/s from ``items``)
against ``cores`` times the rate of a one-core reference variant (``benchmarks/jpeg_pipeline.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tricks_lib._validate import check_positive
from tricks_lib.formatting import html_table, markdown_table
from tricks_lib.measurements import Comparison

__all__ = ["PipelineEfficiency", "pipeline_efficiency"]


@dataclass(frozen=True)
class PipelineEfficiency:
    """Each variant's samples/s as a share of the ideal: ``reference``'s one-core rate times ``cores``.

    Attributes:
        reference: the one-core decode variant the ideal is built from.
        single_core_rate: its samples/s.
        cores: the cores the ideal assumes.
        rates: ``(variant, samples/s, efficiency)`` per variant, from the medians of the same interleaved
            rounds; efficiency = samples/s / (``single_core_rate`` x ``cores``).
    """

    reference: str
    single_core_rate: float
    cores: int
    rates: tuple[tuple[str, float, float], ...]

    def __getitem__(self, variant: str) -> float:
        """The efficiency of ``variant`` (1.0: every core decodes as fast as one core alone)."""
        for name, _, efficiency in self.rates:
            if name == variant:
                return efficiency
        raise KeyError(f"{variant!r} is not one of {[r[0] for r in self.rates]}")

    def _table(self) -> tuple[list[str], list[list[str]]]:
        ideal = self.single_core_rate * self.cores
        header = ["variant", "samples/s", f"share of {self.cores} x {self.single_core_rate:,.0f}/s = {ideal:,.0f}/s"]
        return header, [[name, f"{rate:,.0f}", f"{eff:.0%}"] for name, rate, eff in self.rates]

    def _repr_markdown_(self) -> str:
        return markdown_table(*self._table())

    def _repr_html_(self) -> str:
        return html_table(*self._table())

    def __repr__(self) -> str:
        return markdown_table(*self._table())


def pipeline_efficiency(comparison: Comparison, reference: str, *, cores: int | None = None) -> PipelineEfficiency:
    """Read every variant of ``comparison`` against the ideal of ``cores`` cores decoding like ``reference``.

    Args:
        comparison: a ``compare(...)`` result with ``items`` (samples per call) for its variants.
        reference: the variant that decodes on one core.
        cores: the cores the ideal assumes (default: the cores this process may run on).
    Raises:
        TypeError: ``comparison`` is not a Comparison.
        ValueError: the comparison has no samples/s (no ``items``).
        KeyError: ``reference`` is not a variant.
    """
    if not isinstance(comparison, Comparison):
        raise TypeError(f"comparison must be a Comparison (from compare), got {type(comparison).__name__}")
    cores = len(os.sched_getaffinity(0)) if cores is None and hasattr(os, "sched_getaffinity") else cores
    cores = cores or os.cpu_count() or 1
    check_positive(cores, "cores", allow_none=False, integer=True)
    single = comparison[reference].measurement.items_per_second
    if not single:
        raise ValueError("the comparison has no samples/s: pass items= (samples per call) to compare")
    rates = []
    for name in comparison.names:
        rate = comparison[name].measurement.items_per_second or 0.0
        rates.append((name, rate, rate / (single * cores)))
    return PipelineEfficiency(reference=reference, single_core_rate=single, cores=cores, rates=tuple(rates))
