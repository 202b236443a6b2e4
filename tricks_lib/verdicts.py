"""One verdict mechanism: the closing table a notebook fills row by row from this run's results,
and the reading helpers its cells would otherwise write by hand.

    table = VerdictTable()
    table.add("channels_last", cmp["channels_last"], "when the model has few convolutions")
    table.add("torch.compile", cmp, "short jobs", variant="compiled", against="eager")
    table          # renders as Markdown/HTML; every row was also recorded for the run's summary

Reading helpers: ``verdict_of`` (one variant against the baseline or another variant),
``fastest`` (the variant with the least time per item, and whether it beats every other one
significantly), ``paired_ratio``, ``memory_change`` (saved-for-backward bytes of two reports),
``break_even`` (calls after which a compile pays off). Every one reads results; none prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tricks_lib.formatting import format_bytes, html_table, markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow
from tricks_lib.memory import MemoryReport
from tricks_lib.results import record
from tricks_lib.summary import SummaryRow

if TYPE_CHECKING:
    from tricks_lib.compiling import CompileCost

__all__ = ["VerdictRow", "VerdictTable", "break_even", "fastest", "memory_change", "paired_ratio", "verdict_of"]


def verdict_of(comparison: Comparison, variant: str, against: str | None = None) -> str:
    """``variant``'s verdict against the baseline, or against ``against`` from the same paired rounds.

    Raises:
        KeyError: a name is not a variant of ``comparison``.
    """
    row = comparison[variant] if against is None else comparison.versus(variant, against)
    return row.verdict


def paired_ratio(comparison: Comparison, variant: str, against: str) -> float:
    """How many times faster ``variant`` ran than ``against`` (ratio of medians, per item when items differ)."""
    return comparison.versus(variant, against).speedup


def fastest(comparison: Comparison) -> tuple[str, bool]:
    """The variant with the least time per item, and whether it is significantly faster than every other one."""
    rows = comparison.rows

    def per_item(row: ComparisonRow) -> float:
        m = row.measurement
        return m.median / (m.items if comparison.per_item and m.items else 1)

    best = min(rows, key=per_item)
    clear = all(comparison.versus(best.name, r.name).significant for r in rows if r.name != best.name)
    return best.name, clear


def memory_change(before: MemoryReport, after: MemoryReport, field: str = "peak_saved_bytes") -> str:
    """'3.10x less', 'same', '1.20x more' or 'none kept (was X)': a MemoryReport field of two reports.

    ``field`` defaults to the most saved-for-backward bytes alive at once: for one forward and backward
    that is everything the forward saved; for several passes (accumulation) one pass's worth.

    Raises:
        ValueError: ``field`` is not a byte count of a MemoryReport, or a report lacks it (CUDA-only fields).
    """
    if field not in ("saved_bytes", "peak_saved_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
        raise ValueError(f"field must name a MemoryReport byte count such as 'peak_saved_bytes', got {field!r}")
    base, new = getattr(before, field), getattr(after, field)
    if base is None or new is None:
        raise ValueError(f"{field} was not measured on {before.device} (CUDA only): pick 'peak_saved_bytes'")
    if new == base:
        return "same"
    if new == 0:
        return f"none kept (was {format_bytes(base)})"
    return f"{base / new:.2f}x less" if new < base else f"{new / base:.2f}x more"


def break_even(cost: CompileCost, comparison: Comparison, compiled: str, eager: str) -> dict[str, int] | None:
    """Calls after which compiling paid for itself, ``{"cold": n, "warm": n}`` (fresh-process first calls).

    None unless ``compiled`` ran significantly faster than ``eager`` in ``comparison``: a compile that
    buys nothing measurable is never paid back.
    """
    row = comparison.versus(compiled, eager)
    if not (row.significant and row.speedup > 1):
        return None
    eager_s, compiled_s = comparison[eager].measurement.median, comparison[compiled].measurement.median
    calls = {cache: cost.calls_to_pay_off(eager_s, compiled_s, cache=cache) for cache in ("cold", "warm")}
    if any(n is None for n in calls.values()):
        return None
    return {cache: max(1, math.ceil(n)) for cache, n in calls.items()}


@dataclass(frozen=True)
class VerdictRow:
    """One row of a verdict table: what this run measured for a trick, and when it does not help."""

    record_kind: ClassVar[str] = "verdict"  # the kind ``record()`` files it under

    trick: str
    measured: str
    caveat: str
    device: str = "-"
    speedup: float | None = None  # against the comparison's baseline or ``against``, when read from one
    before: tuple[str, ...] = ()  # cells between the trick and the verdict (e.g. the memory it saved)

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        return (SummaryRow(variant="verdict", device=self.device, speedup=self.speedup, verdict=self.measured),)

    def to_dict(self) -> dict:
        return {
            "trick": self.trick,
            "before": list(self.before),
            "measured": self.measured,
            "caveat": self.caveat,
            "device": self.device,
        }


class VerdictTable:
    """A notebook's closing table, filled row by row from this run's results.

    Each ``add`` also records the row (``tricks_lib.results.record``), so the main command's summary
    lists every notebook's verdicts next to its measurements.

    Args:
        columns: the column titles: the trick, any cells given as ``add(before=...)``, the verdict,
            and when it does not help (default: trick, measured here, when it does not help).
        record_rows: record each row for the summary (default True).
    """

    def __init__(
        self,
        columns: tuple[str, ...] = ("trick", "measured here", "when it does not help"),
        *,
        record_rows: bool = True,
    ):
        if not (isinstance(columns, tuple) and len(columns) >= 3 and all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns must be a tuple of at least 3 column titles, got {columns!r}")
        if not isinstance(record_rows, bool):
            raise TypeError(f"record_rows must be True or False, got {record_rows!r}")
        self.columns, self.record_rows, self.rows = columns, record_rows, []

    def add(
        self,
        trick: str,
        result: Comparison | ComparisonRow | MemoryReport | str,
        caveat: str,
        *,
        variant: str | None = None,
        against: str | None = None,
        note: str = "",
        before: tuple[str, ...] = (),
    ) -> VerdictRow:
        """Add the row for ``trick``, read from ``result``, and return it.

        Args:
            trick: the trick's name as the table shows it.
            result: a ``ComparisonRow`` (its verdict), a ``Comparison`` with ``variant`` (and optionally
                ``against``, another variant to read it against), a ``MemoryReport`` (its saved bytes),
                or a sentence the notebook computed from this run.
            caveat: when the trick does not help: a fixed fact, never an outcome.
            note: appended to the measured text (e.g. the memory it saved).
            before: the cells between the trick and the verdict, one per extra column.

        Raises:
            TypeError: a ``Comparison`` without ``variant``, or a result of another type.
            ValueError: ``before`` does not fill the table's extra columns.
            KeyError: ``variant`` or ``against`` is not a variant of the comparison.
        """
        for name, value in (("trick", trick), ("caveat", caveat), ("note", note)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        extra = len(self.columns) - 3
        if not (isinstance(before, tuple) and all(isinstance(c, str) for c in before)):
            raise TypeError(f"before must be a tuple of strings, got {before!r}")
        if len(before) != extra:
            raise ValueError(
                f"this table has {extra} column(s) before the verdict ({self.columns[1:-2]}), got before={before!r}"
            )
        speedup, device = None, "-"
        if isinstance(result, Comparison):
            if variant is None:
                raise TypeError(
                    f"add({trick!r}, comparison, ...) needs variant=: the row to read from {list(result.names)}"
                )
            row = result[variant] if against is None else result.versus(variant, against)
            measured, speedup, device = row.verdict, row.speedup, result.device
        elif isinstance(result, ComparisonRow):
            measured, speedup, device = result.verdict, result.speedup, result.measurement.device
        elif isinstance(result, MemoryReport):
            measured, device = f"saved for backward {format_bytes(result.peak_saved_bytes)}", result.device
        elif isinstance(result, str):
            measured = result
        else:
            raise TypeError(
                f"result must be a Comparison, ComparisonRow, MemoryReport or a computed sentence, got {type(result).__name__}"
            )
        row = VerdictRow(trick, measured + note, caveat, device, speedup, before)
        self.rows.append(row)
        if self.record_rows:
            record(trick, row)
        return row

    def _body(self) -> list[list[str]]:
        return [[r.trick, *r.before, r.measured, r.caveat] for r in self.rows]

    def to_markdown(self) -> str:
        return markdown_table(list(self.columns), self._body())

    def to_html(self) -> str:
        return html_table(list(self.columns), self._body())

    # Markdown only (no _repr_html_): Jupyter would prefer HTML, whose escaping shows `code` and **bold**
    # in the cells literally.
    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return self.to_markdown()
