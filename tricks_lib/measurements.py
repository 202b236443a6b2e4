"""Result types of the timing harness: values that know their statistics and render themselves.

- ``Measurement``: the per-call times of one callable's timed blocks, their median and IQR.
- ``ComparisonRow``: one variant of a comparison read against a reference.
- ``Comparison``: variants timed interleaved against a named baseline; renders as Markdown/HTML.
"""

from __future__ import annotations

import dataclasses
import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tricks_lib.formatting import format_bytes, format_seconds, html_table, markdown_table
from tricks_lib.outcome import Outcome, SummaryRow
from tricks_lib.stats import (
    CONFIDENCE,
    MIN_BLOCKS_FOR_SPREAD,
    NOISE_THRESHOLD,
    paired_speedup,
    replicate_speedups,
    replicates_agree,
)

if TYPE_CHECKING:
    from tricks_lib.memory import MemoryReport

__all__ = ["Comparison", "ComparisonRow", "Measurement", "paired_row"]


@dataclass(frozen=True)
class Measurement:
    """The timing of one callable: per-call times of each timed block, and their statistics.

    ``times`` holds one entry per timed block (seconds per call, the block's time divided by
    ``number_per_block``); ``median`` and ``iqr`` summarize them.
    """

    record_kind: ClassVar[str] = "measurement"  # the kind ``record()`` files it under

    label: str
    times: tuple[float, ...]
    number_per_block: int
    device: str
    num_threads: int
    items: int | None = None
    median: float = field(init=False)
    iqr: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("a Measurement needs at least one timed block")
        if any(t < 0 or not math.isfinite(t) for t in self.times):
            raise ValueError("block times must be finite and non-negative")
        if self.items is not None and self.items <= 0:
            raise ValueError("items must be a positive count of things processed per call")
        arr = np.asarray(self.times, dtype=float)
        object.__setattr__(self, "median", float(np.median(arr)))
        object.__setattr__(self, "iqr", float(np.percentile(arr, 75) - np.percentile(arr, 25)))

    @property
    def relative_spread(self) -> float:
        """IQR / median (0 for a zero median)."""
        return self.iqr / self.median if self.median > 0 else 0.0

    @property
    def has_spread(self) -> bool:
        """True when there are enough timed blocks (``MIN_BLOCKS_FOR_SPREAD``) for the IQR to mean something."""
        return len(self.times) >= MIN_BLOCKS_FOR_SPREAD

    @property
    def noisy(self) -> bool:
        """True when the spread is large against the median, or unknown: read such a number with care.

        A measurement with too few blocks to estimate its spread is never reported as quiet.
        """
        return not self.has_spread or self.relative_spread > NOISE_THRESHOLD

    @property
    def items_per_second(self) -> float | None:
        if self.items is None or self.median <= 0:
            return None
        return self.items / self.median

    def ratio_to(self, reference: Measurement) -> str:
        """'1.23x the items/s of one process (separate runs, not tested)': this and ``reference``, timed apart.

        The ratio is of items per second when both count items, else of calls per second. Measurements
        taken in separate runs share no interleaved rounds, so there is no paired interval: the words say
        that the ratio was not tested for significance (``compare`` gives the paired verdict).

        Raises:
            TypeError: ``reference`` is not a Measurement.
            ValueError: a median is zero (no rate).
        """
        if not isinstance(reference, Measurement):
            raise TypeError(
                f"reference must be a Measurement (measure(...), or a result's as_measurement()), got {reference!r}"
            )
        for m in (self, reference):
            if m.median <= 0:
                raise ValueError(f"{m.label!r} has a median of zero: time a workload that takes measurable time")
        if self.items and reference.items:
            ratio, rate = self.items_per_second / reference.items_per_second, "items/s"
        else:
            ratio, rate = reference.median / self.median, "calls/s"
        return f"{ratio:.2f}x the {rate} of {reference.label} (separate runs, not tested)"

    def __repr__(self) -> str:
        rate = f", {self.items_per_second:,.0f} items/s" if self.items_per_second else ""
        if not self.has_spread:
            spread, noise = "no spread estimate", ""
        else:
            spread, noise = f"IQR {format_seconds(self.iqr)}", (", noisy" if self.noisy else "")
        return (
            f"Measurement({self.label!r}: median {format_seconds(self.median)}, "
            f"{spread}{rate}, {len(self.times)} blocks x {self.number_per_block}, "
            f"{self.device}, {self.num_threads} thread{'' if self.num_threads == 1 else 's'}{noise})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        return (
            SummaryRow(
                variant=self.label,
                device=self.device,
                median_s=self.median,
                iqr_s=self.iqr,
                items_per_second=self.items_per_second,
                noisy=self.noisy,
            ),
        )

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "median_s": self.median,
            "iqr_s": self.iqr,
            "blocks": len(self.times),
            "number_per_block": self.number_per_block,
            "items_per_second": self.items_per_second,
            "noisy": self.noisy,
            "has_spread": self.has_spread,
            "device": self.device,
            "num_threads": self.num_threads,
        }


def _finite_or_none(x: float) -> float | None:
    """JSON has no NaN or infinity: such values are written as null."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class ComparisonRow:
    """One variant of a comparison, read against the baseline."""

    name: str
    measurement: Measurement
    speedup: float  # baseline time / this time (per item when items differ): > 1 means faster
    ci_low: float  # confidence interval of the paired per-round speedup
    ci_high: float
    significant: bool
    is_baseline: bool
    memory: MemoryReport | None = None
    # Set when this variant was declared to do strictly more work than another (``compare(more_work=)``)
    # yet came out significantly faster than it: an artifact of the measurement, not a speedup.
    suspect: str | None = None
    # The speedup within each replicate (``compare(replicates=)``: rounds on freshly built variants).
    # A paired interval that clears the threshold while one replicate does not is "not significant":
    # the difference did not reproduce on fresh state, so a rerun need not show it.
    replicate_speedups: tuple[float, ...] = ()
    pooled_significant: bool = False  # the paired interval of all rounds alone clears the threshold

    @property
    def not_reproduced(self) -> bool:
        """True when the pooled interval alone would call this significant but a replicate disagrees."""
        return bool(self.replicate_speedups) and self.pooled_significant and not self.significant

    @property
    def outcome(self) -> Outcome:
        """What this row measured, computed once from the paired interval: faster, slower, not significant,
        baseline, or suspect (faster although it does more work, ``compare(more_work=)``)."""
        return Outcome.of(
            self.speedup, self.significant, is_baseline=self.is_baseline, suspect=self.suspect is not None
        )

    @property
    def verdict(self) -> str:
        """The outcome in words: "1.80x faster", "not significant", "baseline" (and why, where it needs saying)."""
        outcome = Outcome.of(self.speedup, self.significant, is_baseline=self.is_baseline)
        if outcome is Outcome.BASELINE:
            verdict = "baseline"
        elif self.not_reproduced:
            each = ", ".join(f"{s:.2f}x" for s in self.replicate_speedups)
            verdict = f"not significant (fresh replicates disagree: {each})"
        elif outcome is Outcome.NOT_SIGNIFICANT:
            verdict = "not significant"
        elif outcome is Outcome.FASTER:
            verdict = f"{self.speedup:.2f}x faster"
        else:
            verdict = f"{1 / self.speedup:.2f}x slower"
        return f"{verdict} (suspect: {self.suspect})" if self.suspect else verdict

    def summary_row(self) -> SummaryRow:
        m, mem = self.measurement, self.memory
        return SummaryRow(
            variant=self.name,
            device=m.device,
            median_s=m.median,
            iqr_s=m.iqr,
            speedup=_finite_or_none(self.speedup),
            verdict=self.verdict,
            items_per_second=m.items_per_second,
            saved_bytes=mem.saved_bytes if mem else None,
            peak_saved_bytes=mem.peak_saved_bytes if mem else None,
            # the call's own peak: above what was already allocated when it began (CUDA), not the process's
            peak_allocated_bytes=mem.peak_extra_bytes if mem else None,
            noisy=m.noisy,
            speedup_low=None if self.is_baseline else _finite_or_none(self.ci_low),
            speedup_high=None if self.is_baseline else _finite_or_none(self.ci_high),
            significant=None if self.is_baseline else self.significant,
            outcome=self.outcome.value,
        )

    def to_dict(self) -> dict:
        out = {"variant": self.name, **self.measurement.to_dict()}
        out.update(
            speedup=_finite_or_none(self.speedup),
            speedup_ci=[_finite_or_none(self.ci_low), _finite_or_none(self.ci_high)],
            significant=self.significant,
            verdict=self.verdict,
            outcome=self.outcome.value,
            suspect=self.suspect,
        )
        if self.replicate_speedups:
            out["replicate_speedups"] = [_finite_or_none(x) for x in self.replicate_speedups]
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out


@dataclass(frozen=True)
class Comparison:
    """Variants timed interleaved round by round against a named baseline."""

    record_kind: ClassVar[str] = "comparison"  # the kind ``record()`` files it under

    label: str
    baseline: str
    rows: tuple[ComparisonRow, ...]
    rounds: int
    device: str
    num_threads: int
    min_effect: float
    per_item: bool = False  # speedups compare time per item (variants process different counts)
    # Rounds in each replicate, in order (empty: one stretch of rounds on variants built once).
    replicate_rounds: tuple[int, ...] = ()

    def __getitem__(self, name: str) -> ComparisonRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no variant {name!r}; variants are {[r.name for r in self.rows]}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rows)

    def versus(self, name: str, reference: str) -> ComparisonRow:
        """Variant ``name`` read against ``reference`` instead of the baseline, from the same paired rounds.

        Raises:
            KeyError: either name is not a variant.
        """
        row, ref = self[name], self[reference]
        items = (row.measurement.items, ref.measurement.items) if self.per_item else (1, 1)
        speedup, lo, hi, pooled = paired_speedup(
            ref.measurement.times, row.measurement.times, items[1], items[0], self.min_effect
        )
        each: tuple[float, ...] = ()
        if self.replicate_rounds:
            each = replicate_speedups(
                ref.measurement.times, row.measurement.times, items[1], items[0], self.replicate_rounds
            )
        if name == reference:
            speedup, lo, hi, pooled, each = 1.0, 1.0, 1.0, False, ()
        return dataclasses.replace(
            row,
            speedup=speedup,
            ci_low=lo,
            ci_high=hi,
            significant=pooled and replicates_agree(each, self.min_effect),
            pooled_significant=pooled,
            replicate_speedups=each,
            is_baseline=name == reference,
        )

    def fastest(self) -> tuple[str, bool]:
        """The variant with the least time per item, and whether it is significantly faster than every other one."""

        def per_item(row: ComparisonRow) -> float:
            m = row.measurement
            return m.median / (m.items if self.per_item and m.items else 1)

        best = min(self.rows, key=per_item)
        others = [r.name for r in self.rows if r.name != best.name]
        return best.name, all(self.versus(best.name, name).outcome is Outcome.FASTER for name in others)

    def _table(self) -> tuple[list[str], list[list[str]]]:
        with_items = any(r.measurement.items is not None for r in self.rows)
        with_memory = any(r.memory is not None for r in self.rows)
        header = ["variant", "median", "IQR", "speedup", "verdict"]
        if with_items:
            header.insert(3, "items/s")
        if with_memory:
            header += ["saved for backward", "peak allocated by the call"]
        body = []
        for r in self.rows:
            m = r.measurement
            cells = [r.name, format_seconds(m.median), format_seconds(m.iqr), f"{r.speedup:.2f}x", r.verdict]
            if not m.has_spread:
                cells[2] = f"- ({len(m.times)} block{'s' if len(m.times) > 1 else ''}: no spread estimate)"
            elif m.noisy:
                cells[2] += " (noisy)"
            if with_items:
                cells.insert(3, f"{m.items_per_second:,.0f}" if m.items_per_second else "-")
            if with_memory:
                mem = r.memory
                cells.append(mem.saved_text if mem else "-")
                peak = mem.peak_extra_bytes if mem else None  # the call's own, above what it started with
                cells.append(format_bytes(peak) if peak is not None else f"n/a ({self.device})")
            body.append(cells)
        return header, body

    def _caption(self) -> str:
        return (
            f"{self.label}: {self.rounds} interleaved rounds on {self.device}, {self.num_threads} thread{'' if self.num_threads == 1 else 's'}; "
            f"'significant' = the {CONFIDENCE:.0%} paired interval of the speedup lies at least "
            f"{self.min_effect:.0%} away from 1x"
            + (
                f" and each of {len(self.replicate_rounds)} replicates (rounds on freshly built variants) "
                f"shows at least {self.min_effect:.0%} in the same direction"
                if self.replicate_rounds
                else ""
            )
            + "; variant order shuffled per round"
            + ("; speedup per item, since the variants process different numbers of items" if self.per_item else "")
        )

    def to_markdown(self) -> str:
        header, body = self._table()
        return markdown_table(header, body, caption=self._caption())

    def _repr_html_(self) -> tuple[str, dict]:
        """The table, with each variant's outcome as the output's metadata: tests read a notebook's closing rows
        against the comparisons it showed (``tests/project/test_closing_rows.py``)."""
        header, body = self._table()
        shown = {
            "comparison": self.label,
            "baseline": self.baseline,
            "outcomes": {r.name: r.outcome.value for r in self.rows if not r.is_baseline},
        }
        return html_table(header, body, caption=self._caption()), {"tricks_lib": shown}

    def __repr__(self) -> str:
        return self.to_markdown()

    def plot(self, ax=None):
        """Bars of each variant's median time with its IQR; returns the matplotlib Axes."""
        from tricks_lib.plot import speedup_bars

        return speedup_bars(self, ax=ax)

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        return tuple(dataclasses.replace(r.summary_row(), min_effect=self.min_effect) for r in self.rows)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "baseline": self.baseline,
            "rounds": self.rounds,
            "replicate_rounds": list(self.replicate_rounds),
            "device": self.device,
            "num_threads": self.num_threads,
            "rows": [r.to_dict() for r in self.rows],
        }


def paired_row(
    measurement: Measurement,
    baseline: Measurement,
    *,
    min_effect: float,
    scale: int = 1,
    base_scale: int = 1,
    replicate_rounds: tuple[int, ...] = (),
    **fields,
) -> ComparisonRow:
    """``measurement`` read against ``baseline`` from their paired per-round block times.

    ``scale``/``base_scale``: items per call, so that different batch sizes compare by throughput.
    With ``replicate_rounds``, significant also needs every replicate to agree. ``fields``: the
    row's other fields (memory, suspect). The baseline's own row is ``paired_row(b, b, ...)``.
    """
    each: tuple[float, ...] = ()
    if measurement is baseline:
        speedup, lo, hi, pooled = 1.0, 1.0, 1.0, False
    else:
        speedup, lo, hi, pooled = paired_speedup(baseline.times, measurement.times, base_scale, scale, min_effect)
        if replicate_rounds:
            each = replicate_speedups(baseline.times, measurement.times, base_scale, scale, replicate_rounds)
    return ComparisonRow(
        name=measurement.label,
        measurement=measurement,
        speedup=speedup,
        ci_low=lo,
        ci_high=hi,
        significant=pooled and replicates_agree(each, min_effect),
        is_baseline=measurement is baseline,
        replicate_speedups=each,
        pooled_significant=pooled,
        **fields,
    )
