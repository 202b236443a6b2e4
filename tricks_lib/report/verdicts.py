"""One verdict mechanism: the closing table a notebook fills row by row from this run's results,
and the reading helpers its cells would otherwise write by hand.

    table = VerdictTable()
    table.add("channels_last", cmp["channels_last"], "when the model has few convolutions")
    table.add("torch.compile", cmp, "short jobs", variant="compiled", against="eager")
    table          # renders as Markdown/HTML; every row was also recorded for the run's summary

Reading helpers: ``verdict_of`` (one variant against the baseline or another variant),
``fastest`` (the variant with the least time per item, and whether it beats every other one
significantly), ``paired_ratio``, ``memory_change`` (saved-for-backward bytes of two reports),
``break_even`` (calls after which a compile pays off) and ``break_even_note`` (the same in words),
``separate_runs_ratio`` (two measurements timed apart, in words), ``direction`` and ``overall`` (the word a
conditional paragraph would branch on, for one row or several), ``by_outcome`` (names grouped by
verdict), ``trade_off`` (time and saved-for-backward memory of variants, one table) and
``median_drift`` (how far the same workload's median moved between cells). Every one reads results;
none prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tricks_lib._validate import check_flag, check_positive
from tricks_lib.formatting import format_bytes, format_seconds, html_table, markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.outcome import Outcome, SummaryRow
from tricks_lib.report.results import record

if TYPE_CHECKING:
    from tricks_lib.compiling import CompileCost

__all__ = [
    "MedianDrift",
    "TradeOff",
    "TradeOffRow",
    "VerdictRow",
    "VerdictTable",
    "break_even",
    "break_even_note",
    "by_outcome",
    "direction",
    "fastest",
    "median_drift",
    "memory_change",
    "overall",
    "paired_ratio",
    "separate_runs_ratio",
    "trade_off",
    "verdict_of",
]


def verdict_of(comparison: Comparison, variant: str, against: str | None = None) -> str:
    """``variant``'s verdict against the baseline, or against ``against`` from the same paired rounds.

    Raises:
        KeyError: a name is not a variant of ``comparison``.
    """
    row = comparison[variant] if against is None else comparison.versus(variant, against)
    return row.verdict


def paired_ratio(comparison: Comparison, variant: str, against: str) -> float:
    """How many times faster ``variant`` ran than ``against`` (the median paired ratio of their rounds, per item when items differ)."""
    return comparison.versus(variant, against).speedup


def fastest(comparison: Comparison) -> tuple[str, bool]:
    """The variant with the least time per item, and whether it is significantly faster than every other one."""
    rows = comparison.rows

    def per_item(row: ComparisonRow) -> float:
        m = row.measurement
        return m.median / (m.items if comparison.per_item and m.items else 1)

    best = min(rows, key=per_item)
    clear = all(comparison.versus(best.name, r.name).outcome is Outcome.FASTER for r in rows if r.name != best.name)
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
    if row.outcome is not Outcome.FASTER:
        return None
    eager_s, compiled_s = comparison[eager].measurement.median, comparison[compiled].measurement.median
    calls = {cache: cost.calls_to_pay_off(eager_s, compiled_s, cache=cache) for cache in ("cold", "warm")}
    if any(n is None for n in calls.values()):
        return None
    return {cache: max(1, math.ceil(n)) for cache, n in calls.items()}


def break_even_note(calls: Mapping[str, int] | None, unit: str = "calls") -> str:
    """'pays off after 3,334 calls cold, 334 warm', or 'never pays off here': a ``break_even`` result in words.

    Args:
        calls: what ``break_even`` returned: ``{"cold": n, "warm": n}``, or None (never paid back).
        unit: what the counts count, e.g. "steps" for a compiled training step.

    Raises:
        TypeError: ``calls`` is neither None nor a mapping of whole numbers, or ``unit`` is not a string.
        ValueError: ``calls`` lacks its "cold" or "warm" count, a count is not positive, or ``unit`` is empty.
    """
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a string such as 'calls' or 'steps', got {type(unit).__name__}")
    if not unit.strip():
        raise ValueError("unit must name what is counted, such as 'calls' or 'steps'")
    if calls is None:
        return "never pays off here"
    if not isinstance(calls, Mapping):
        raise TypeError(f"calls must be break_even()'s result (a dict or None), got {type(calls).__name__}")
    missing = [cache for cache in ("cold", "warm") if cache not in calls]
    if missing:
        raise ValueError(f"calls must hold 'cold' and 'warm' counts, as break_even() returns; missing {missing}")
    for cache in ("cold", "warm"):
        check_positive(calls[cache], f"calls[{cache!r}]", allow_none=False, integer=True)
    return f"pays off after {calls['cold']:,} {unit} cold, {calls['warm']:,} warm"


def separate_runs_ratio(measurement: Measurement, reference: Measurement) -> str:
    """'1.23x the items/s of one process (separate runs, not tested)': two measurements timed apart, in words.

    The ratio is of items per second when both measurements count items, else of calls per second.
    Measurements taken in separate runs share no interleaved rounds, so there is no paired interval:
    the words say that the ratio was not tested for significance (``compare`` gives the paired verdict).

    Raises:
        TypeError: an argument is not a Measurement.
        ValueError: a median is zero (no rate).
    """
    for name, m in (("measurement", measurement), ("reference", reference)):
        if not isinstance(m, Measurement):
            raise TypeError(f"{name} must be a Measurement (measure(...), or a result's as_measurement()), got {m!r}")
        if m.median <= 0:
            raise ValueError(f"{name} {m.label!r} has a median of zero: time a workload that takes measurable time")
    if measurement.items and reference.items:
        ratio, rate = measurement.items_per_second / reference.items_per_second, "items/s"
    else:
        ratio, rate = reference.median / measurement.median, "calls/s"
    return f"{ratio:.2f}x the {rate} of {reference.label} (separate runs, not tested)"


def direction(row: ComparisonRow) -> str:
    """'faster', 'slower', 'not significant', 'suspect' or 'baseline': ``row.outcome`` as one word.

    Raises:
        TypeError: ``row`` is not a ComparisonRow.
    """
    if not isinstance(row, ComparisonRow):
        raise TypeError(f"row must be a ComparisonRow (comparison[name]), got {type(row).__name__}")
    return row.outcome.value


def overall(rows: Iterable[ComparisonRow]) -> str:
    """'all faster', 'all slower', 'none significant' or 'mixed': the non-baseline rows' outcomes read together.

    A suspect row (faster although it does more work) is not a speedup: it reads as not significant here.

    Raises:
        TypeError: an element is not a ComparisonRow.
        ValueError: no non-baseline row is given.
    """
    words = {_plain_outcome(r) for r in rows} - {Outcome.BASELINE}
    if not words:
        raise ValueError("overall() needs at least one row that is not the baseline")
    if words == {Outcome.NOT_SIGNIFICANT}:
        return "none significant"
    return f"all {words.pop().value}" if len(words) == 1 else "mixed"


def by_outcome(rows: Mapping[str, ComparisonRow]) -> dict[str, tuple[str, ...]]:
    """The names of ``rows`` grouped by outcome: keys 'faster', 'slower', 'not significant' (in that order).

    Baseline rows are left out; a suspect row counts as not significant. Raises TypeError for a value that
    is not a ComparisonRow.
    """
    groups: dict[Outcome, list[str]] = {Outcome.FASTER: [], Outcome.SLOWER: [], Outcome.NOT_SIGNIFICANT: []}
    for name, row in rows.items():
        outcome = _plain_outcome(row)
        if outcome is not Outcome.BASELINE:
            groups[outcome].append(name)
    return {outcome.value: tuple(names) for outcome, names in groups.items()}


def _plain_outcome(row: ComparisonRow) -> Outcome:
    """``row``'s outcome with a suspect speedup read as what it is: not a significant difference."""
    if not isinstance(row, ComparisonRow):
        raise TypeError(f"expected a ComparisonRow (comparison[name]), got {type(row).__name__}")
    return Outcome.NOT_SIGNIFICANT if row.outcome is Outcome.SUSPECT else row.outcome


@dataclass(frozen=True)
class TradeOffRow:
    """Time and memory of one variant against another, read from the same comparison."""

    variant: str
    against: str
    time: str  # the paired time verdict
    memory: str  # memory_change() of the two reports' ``field``
    bytes_before: int  # ``field`` of ``against``
    bytes_after: int  # ``field`` of ``variant``
    cuda_peak_before: int | None = None  # CUDA: the allocator's peak above the start (None elsewhere)
    cuda_peak_after: int | None = None


@dataclass(frozen=True)
class TradeOff:
    """Time and saved-for-backward memory of a comparison's variants; renders as one Markdown table.

    The CUDA allocator column appears only when the comparison measured it (on a GPU).
    """

    label: str
    field: str
    rows: tuple[TradeOffRow, ...]

    def __getitem__(self, variant: str) -> TradeOffRow:
        for row in self.rows:
            if row.variant == variant:
                return row
        raise KeyError(f"{variant!r} is not a row of this trade-off; rows: {[r.variant for r in self.rows]}")

    @property
    def has_cuda_peaks(self) -> bool:
        return any(r.cuda_peak_after is not None for r in self.rows)

    def to_markdown(self) -> str:
        header = ["variant", "against", "time", f"memory ({self.field})", "bytes: before -> after"]
        body = [
            [r.variant, r.against, r.time, r.memory, f"{format_bytes(r.bytes_before)} -> {format_bytes(r.bytes_after)}"]
            for r in self.rows
        ]
        if self.has_cuda_peaks:
            header.append("CUDA allocator peak above start: before -> after")
            for line, r in zip(body, self.rows):
                line.append(f"{format_bytes(r.cuda_peak_before)} -> {format_bytes(r.cuda_peak_after)}")
        return markdown_table(header, body, caption=f"**{self.label}**")

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return self.to_markdown()


def trade_off(
    comparison: Comparison,
    variants: Iterable[str] | None = None,
    *,
    against: str | None = None,
    field: str = "peak_saved_bytes",
) -> TradeOff:
    """Time and memory of ``variants`` (default: every row but ``against``) against ``against`` (default: the baseline).

    The comparison must have been run with ``memory=True``. Time is the paired verdict; memory is
    ``memory_change`` of the MemoryReport ``field`` (default: the most saved-for-backward bytes alive at once).

    Raises:
        KeyError: a name is not a variant of ``comparison``.
        ValueError: the comparison has no memory reports, or ``field`` is not a byte count (see memory_change).
    """
    against = comparison.baseline if against is None else against
    names = [r.name for r in comparison.rows if r.name != against] if variants is None else list(variants)
    base = comparison[against]
    rows = []
    for name in names:
        row = comparison[name] if against == comparison.baseline else comparison.versus(name, against)
        if base.memory is None or comparison[name].memory is None:
            raise ValueError(f"{comparison.label!r} has no memory reports: run compare(..., memory=True)")
        before, after = base.memory, comparison[name].memory
        rows.append(
            TradeOffRow(
                name,
                against,
                row.verdict,
                memory_change(before, after, field),
                getattr(before, field),
                getattr(after, field),
                before.peak_extra_bytes,
                after.peak_extra_bytes,
            )
        )
    return TradeOff(comparison.label, field, tuple(rows))


@dataclass(frozen=True)
class MedianDrift:
    """The medians of one workload timed in several cells, and how far apart they are (largest / smallest)."""

    medians: tuple[tuple[str, float], ...]  # (where it was timed, median seconds per call)

    @property
    def ratio(self) -> float:
        values = [m for _, m in self.medians]
        return max(values) / min(values)

    def to_markdown(self) -> str:
        body = [[cell, format_seconds(m)] for cell, m in self.medians]
        body.append(["largest / smallest", f"{self.ratio:.2f}x"])
        return markdown_table(["timed in", "median"], body)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return self.to_markdown()


def median_drift(timings: Mapping[str, ComparisonRow | Measurement]) -> MedianDrift:
    """How far the median of the same workload moved between the cells that timed it.

    Args:
        timings: where each timing was taken (a cell or section name) -> its ComparisonRow or Measurement.

    Raises:
        TypeError: a value is neither a ComparisonRow nor a Measurement.
        ValueError: fewer than two timings, or a median of zero.
    """
    medians = []
    for cell, timing in timings.items():
        if isinstance(timing, ComparisonRow):
            timing = timing.measurement
        if not isinstance(timing, Measurement):
            raise TypeError(f"{cell!r}: expected a ComparisonRow or Measurement, got {type(timing).__name__}")
        medians.append((cell, timing.median))
    if len(medians) < 2:
        raise ValueError(f"median_drift needs the same workload timed at least twice, got {len(medians)}")
    if min(m for _, m in medians) <= 0:
        raise ValueError("a median of zero has no ratio: time a workload that takes measurable time")
    return MedianDrift(tuple(medians))


@dataclass(frozen=True)
class VerdictRow:
    """One row of a verdict table: what this run measured for a trick, and when it does not help."""

    record_kind: ClassVar[str] = "verdict"  # the kind ``record()`` files it under

    trick: str
    measured: str
    caveat: str
    device: str = "-"
    speedup: float | None = None  # against the comparison's baseline or ``against``, when read from one
    outcome: Outcome | None = None  # the outcome of the comparison row it was read from (None: not read from one)
    before: tuple[str, ...] = ()  # cells between the trick and the verdict (e.g. the memory it saved)
    columns: tuple[str, ...] = ()  # the titles of ``before``'s cells and of ``measured``, as the table shows them

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        """One row; a table with cells before its verdict (01's vs / warm / cold) puts them in the row's text,
        each with its title ("vs: folder; warm: 4.91x faster; ..."), since part of what was measured is there."""
        text = self.measured
        if self.before:
            text = "; ".join(f"{title}: {cell}" for title, cell in zip(self.columns, (*self.before, self.measured)))
        outcome = None if self.outcome is None else self.outcome.value
        return (SummaryRow(variant="verdict", device=self.device, speedup=self.speedup, verdict=text, outcome=outcome),)

    def to_dict(self) -> dict:
        return {
            "trick": self.trick,
            "before": list(self.before),
            "measured": self.measured,
            "caveat": self.caveat,
            "device": self.device,
            "columns": list(self.columns),
        }


class VerdictTable:
    """A notebook's closing table, filled row by row from this run's results.

    Each ``add`` also records the row (``tricks_lib.report.results.record``), so the main command's summary
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
        result: Comparison | ComparisonRow | MemoryReport | Mapping[str, object] | str,
        caveat: str,
        *,
        variant: str | None = None,
        against: str | None = None,
        note: str = "",
        replicates: bool = False,
        before: tuple[str, ...] = (),
    ) -> VerdictRow:
        """Add the row for ``trick``, read from ``result``, and return it.

        Args:
            trick: the trick's name as the table shows it.
            result: a ``ComparisonRow`` (its verdict), a ``Comparison`` with ``variant`` (and optionally
                ``against``, another variant to read it against), a ``MemoryReport`` (its saved bytes),
                a mapping of labels to values computed from this run (shown as 'label: value; ...'),
                or a sentence the notebook computed from this run.
            caveat: when the trick does not help: a fixed fact, never an outcome.
            note: appended to the measured text (e.g. the memory it saved).
            replicates: append the speedup of each fresh replicate (a comparison run with ``replicates=``).
            before: the cells between the trick and the verdict, one per extra column.

        Raises:
            TypeError: a ``Comparison`` without ``variant``, a mapping with a key that is not a string,
                or a result of another type.
            ValueError: ``before`` does not fill the table's extra columns, an empty mapping, or
                ``replicates=True`` for a result without replicates.
            KeyError: ``variant`` or ``against`` is not a variant of the comparison.
        """
        for name, value in (("trick", trick), ("caveat", caveat), ("note", note)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        check_flag(replicates, "replicates")
        extra = len(self.columns) - 3
        if not (isinstance(before, tuple) and all(isinstance(c, str) for c in before)):
            raise TypeError(f"before must be a tuple of strings, got {before!r}")
        if len(before) != extra:
            raise ValueError(
                f"this table has {extra} column(s) before the verdict ({self.columns[1:-2]}), got before={before!r}"
            )
        speedup, device, read = None, "-", None  # read: the ComparisonRow, when there is one
        if isinstance(result, Comparison):
            if variant is None:
                raise TypeError(
                    f"add({trick!r}, comparison, ...) needs variant=: the row to read from {list(result.names)}"
                )
            read = result[variant] if against is None else result.versus(variant, against)
            measured, speedup, device = read.verdict, read.speedup, result.device
        elif isinstance(result, ComparisonRow):
            read = result
            measured, speedup, device = result.verdict, result.speedup, result.measurement.device
        elif isinstance(result, MemoryReport):
            measured, device = f"saved for backward {format_bytes(result.peak_saved_bytes)}", result.device
        elif isinstance(result, Mapping):
            measured = _labelled_values(trick, result)
        elif isinstance(result, str):
            measured = result
        else:
            raise TypeError(
                "result must be a Comparison, ComparisonRow, MemoryReport, a mapping of computed values "
                f"or a computed sentence, got {type(result).__name__}"
            )
        if replicates:
            if read is None or not read.replicate_speedups:
                raise ValueError(
                    f"add({trick!r}, ..., replicates=True) needs a comparison run with compare(..., replicates=n)"
                )
            note = f" (each replicate: {', '.join(f'{s:.2f}x' for s in read.replicate_speedups)})" + note
        outcome = None if read is None else read.outcome
        row = VerdictRow(trick, measured + note, caveat, device, speedup, outcome, before, self.columns[1:-1])
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


def _labelled_values(trick: str, values: Mapping[str, object]) -> str:
    """'copy avoided: 16.0 MiB; the copy took: 3.1 ms': a mapping of computed values as one cell's text."""
    if not values:
        raise ValueError(f"add({trick!r}, {{}}, ...): the mapping of computed values is empty")
    for label in values:
        if not isinstance(label, str):
            raise TypeError(f"add({trick!r}, mapping, ...): every label must be a string, got {label!r}")
    return "; ".join(f"{label}: {value}" for label, value in values.items())
