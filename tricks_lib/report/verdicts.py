"""One verdict mechanism: the closing table a notebook fills row by row from this run's results.

    table = VerdictTable()
    table.add("batch size", sweep, "once the device is saturated")   # every variant: the best one and the rest
    table.add("torch.compile", cmp, "short jobs", variant="compiled", against="eager")  # "compiled: 1.4x faster than eager"
    table          # renders as Markdown/HTML; every row was also recorded for the run's summary

A row read from a comparison says what its subject is ("compiled: 1.40x faster than eager"), and a row that stands
for a comparison of several variants reads all of them (``read_variants``): the best significant one and its verdict,
then the others by outcome, so a closing row never reads one variant of a sweep as the whole trick.

Each row carries the outcome of the comparison row it was read from (``Outcome``), so the summary, the
diff and the HTML page read the outcome, never the sentence. Two readings that the memory notebook and the
training notebook share live here too: ``trade_off`` (time and saved-for-backward memory of variants, one
table) and ``median_drift`` (how far the same workload's median moved between cells). Readings of a single
result live on its type: ``Comparison.versus``/``fastest``, ``MemoryReport.change_from``,
``CompileCost.break_even``, ``Measurement.ratio_to``. Nothing here prints.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tricks_lib._validate import check_flag
from tricks_lib.formatting import format_bytes, format_seconds, html_table, markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.outcome import Outcome, SummaryRow
from tricks_lib.report.copy_list import CopyList, copy_list
from tricks_lib.report.results import record

if TYPE_CHECKING:
    pass

__all__ = [
    "MedianDrift",
    "TradeOff",
    "TradeOffRow",
    "VariantsReading",
    "VerdictRow",
    "VerdictTable",
    "median_drift",
    "read_variants",
    "trade_off",
]


@dataclass(frozen=True)
class TradeOffRow:
    """Time and memory of one variant against another, read from the same comparison."""

    variant: str
    against: str
    time: str  # the paired time verdict
    memory: str  # MemoryReport.change_from() of the two reports' ``field``
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
    ``MemoryReport.change_from`` of the ``field`` (default: the most saved-for-backward bytes alive at once).

    Raises:
        KeyError: a name is not a variant of ``comparison``.
        ValueError: the comparison has no memory reports, or ``field`` is not a byte count (see MemoryReport.change_from).
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
                after.change_from(before, field),
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
class VariantsReading:
    """Variants of one comparison, each read against one reference (``read_variants``).

    Its text names every variant it read: the best significantly faster one with its speedup, then the others by
    outcome ("batch 128: 1.37x faster than batch 8 (best); also faster: batch 32 (1.33x); not significant:
    batch 512"). Its outcome is the best one's: faster when any variant is significantly faster, else not
    significant when any is not (or is suspect), else slower.
    """

    label: str | None  # the comparison's label (None: a row read alone, without its comparison)
    reference: str | None  # the variant every row was read against (None: not known, a row read alone)
    rows: tuple[ComparisonRow, ...]  # each read against ``reference``, in the comparison's order

    @property
    def best(self) -> ComparisonRow | None:
        """The significantly faster variant with the largest paired speedup (None: no variant is faster)."""
        faster = [r for r in self.rows if r.outcome is Outcome.FASTER]
        return max(faster, key=lambda r: r.speedup) if faster else None

    @property
    def outcome(self) -> Outcome:
        if len(self.rows) == 1:
            return self.rows[0].outcome
        outcomes = {r.outcome for r in self.rows}
        if Outcome.FASTER in outcomes:
            return Outcome.FASTER
        if outcomes & {Outcome.NOT_SIGNIFICANT, Outcome.SUSPECT}:
            return Outcome.NOT_SIGNIFICANT
        return Outcome.SLOWER

    @property
    def speedup(self) -> float | None:
        """The best variant's speedup; a single variant's speedup whatever its outcome; else None."""
        best = self.best
        if best is not None:
            return best.speedup
        return self.rows[0].speedup if len(self.rows) == 1 else None

    def text(self) -> str:
        if len(self.rows) == 1:
            return _subject_verdict(self.rows[0], self.reference)
        best = self.best
        parts = [f"{_subject_verdict(best, self.reference)} (best)" if best else f"none faster than {self.reference}"]
        rest = [r for r in self.rows if r is not best]
        faster = [f"{r.name} ({r.speedup:.2f}x)" for r in rest if r.outcome is Outcome.FASTER]
        slower = [f"{r.name} ({1 / r.speedup:.2f}x slower)" for r in rest if r.outcome is Outcome.SLOWER]
        same = [r.name for r in rest if r.outcome is Outcome.NOT_SIGNIFICANT]
        suspect = [f"{r.name} ({r.speedup:.2f}x, suspect: {r.suspect})" for r in rest if r.outcome is Outcome.SUSPECT]
        for title, names in (("also faster", faster), ("slower", slower), ("not significant", same)):
            if names:
                parts.append(f"{title}: {', '.join(names)}")
        if suspect:
            parts.append(f"faster but suspect: {', '.join(suspect)}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        """What the row read, as stored with the notebook's closing table (tests check the row against it)."""
        return {
            "comparison": self.label,
            "reference": self.reference,
            "outcomes": {r.name: r.outcome.value for r in self.rows},
            "speedups": {r.name: r.speedup if math.isfinite(r.speedup) else None for r in self.rows},
        }


def read_variants(
    comparison: Comparison, variants: Iterable[str] | None = None, *, against: str | None = None
) -> VariantsReading:
    """Read ``variants`` (default: every variant but ``against``) against ``against`` (default: the baseline).

    Raises:
        KeyError: a name is not a variant of ``comparison``.
        ValueError: no variant is left to read (only the reference was named).
    """
    reference = comparison.baseline if against is None else against
    comparison[reference]  # KeyError with the variant names when it is not one
    names = [n for n in comparison.names if n != reference] if variants is None else list(variants)
    names = [n for n in names if n != reference]
    if not names:
        raise ValueError(
            f"{comparison.label!r}: no variant to read against {reference!r}; variants: {comparison.names}"
        )
    rows = tuple(comparison[n] if reference == comparison.baseline else comparison.versus(n, reference) for n in names)
    return VariantsReading(comparison.label, reference, rows)


def _subject_verdict(row: ComparisonRow, reference: str | None) -> str:
    """'compiled: 1.40x faster than eager', 'compiled vs eager: not significant': the subject of the verdict is
    the variant, so its direction cannot be read backwards."""
    than = f" than {reference}" if reference else ""
    if row.outcome in (Outcome.FASTER, Outcome.SLOWER, Outcome.SUSPECT):
        word, factor = ("faster", row.speedup) if row.speedup > 1 else ("slower", 1 / row.speedup)
        text = f"{row.name}: {factor:.2f}x {word}{than}"
        return f"{text} (suspect: {row.suspect})" if row.suspect else text
    versus = f" vs {reference}" if reference else ""
    return f"{row.name}{versus}: {row.verdict}"


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
    source: VariantsReading | None = None  # the comparison variants it read (None: not read from a comparison)
    copy: str = ""  # the trick's own lines, for the notebook's what-to-copy cell ("": nothing to paste)
    helped: bool | None = None  # whether it helped in this run (None: no lines to copy)
    helped_from: str = ""  # "outcome" (read from the comparison) or "computed" (the notebook's own bool)

    @property
    def text(self) -> str:
        """What the row measured, with the cells before its verdict and their titles when the table has any
        ("saved for backward: 12.0 MiB; time: 1.64x slower"): part of what was measured is there."""
        if not self.before:
            return self.measured
        return "; ".join(f"{title}: {cell}" for title, cell in zip(self.columns, (*self.before, self.measured)))

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        """One row, whose text is ``text`` (01's vs / warm / cold cells included)."""
        outcome = None if self.outcome is None else self.outcome.value
        return (
            SummaryRow(variant="verdict", device=self.device, speedup=self.speedup, verdict=self.text, outcome=outcome),
        )

    def to_dict(self) -> dict:
        return {
            "trick": self.trick,
            "before": list(self.before),
            "measured": self.measured,
            "caveat": self.caveat,
            "device": self.device,
            "columns": list(self.columns),
            "outcome": None if self.outcome is None else self.outcome.value,
            "source": None if self.source is None else self.source.to_dict(),
            "copy": self.copy,
            "helped": self.helped,
            "helped_from": self.helped_from,
        }


class VerdictTable:
    """A notebook's closing table, filled row by row from this run's results.

    Each ``add`` also records the row (``tricks_lib.report.results.record``), so the main command's summary
    lists every notebook's verdicts next to its measurements. With ``record_results=True`` it records the
    result a row reads as well (a ``Comparison`` or ``MemoryReport``, once per result,
    under the first row's trick), so that one call in the cell where a trick is measured records both
    the measurement and its closing-table row.

    Args:
        columns: the column titles: the trick, any cells given as ``add(before=...)``, the verdict,
            and when it does not help (default: trick, measured here, when it does not help).
        record_rows: record each row for the summary (default True).
        record_results: also record the result each row reads, once per result (default False: the
            notebook records its measurements itself with ``record``).
    """

    def __init__(
        self,
        columns: tuple[str, ...] = ("trick", "measured here", "when it does not help"),
        *,
        record_rows: bool = True,
        record_results: bool = False,
    ):
        if not (isinstance(columns, tuple) and len(columns) >= 3 and all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns must be a tuple of at least 3 column titles, got {columns!r}")
        check_flag(record_rows, "record_rows")
        check_flag(record_results, "record_results")
        self.columns, self.record_rows, self.record_results, self.rows = columns, record_rows, record_results, []
        # The results recorded so far, kept alive: told apart by identity, and a freed result's id could
        # otherwise come back for the next one, which would then never be recorded.
        self._recorded: list[object] = []

    def add(
        self,
        trick: str,
        result: Comparison | ComparisonRow | MemoryReport | Mapping[str, object] | str,
        caveat: str,
        *,
        variant: str | None = None,
        variants: Iterable[str] | None = None,
        against: str | None = None,
        note: str = "",
        replicates: bool = False,
        before: tuple[str, ...] = (),
        copy: str = "",
        helped: bool | None = None,
    ) -> VerdictRow:
        """Add the row for ``trick``, read from ``result``, and return it.

        Args:
            trick: the trick's name as the table shows it.
            result: a ``Comparison``: read ``variant`` alone, else ``variants`` (default: all of them), each
                against ``against`` (default: the baseline), with ``read_variants``: the text names the subject
                ("x: 1.30x faster than y") and, for several variants, the best one and every other one's outcome;
                a ``ComparisonRow`` (its verdict, after its name); a ``MemoryReport`` (its saved bytes);
                a mapping of labels to values computed from this run (shown as 'label: value; ...');
                or a sentence the notebook computed from this run.
            caveat: when the trick does not help: a fixed fact, never an outcome.
            note: appended to the measured text (e.g. the memory it saved).
            replicates: append the speedup of each fresh replicate (a comparison run with ``replicates=``).
            before: the cells between the trick and the verdict, one per extra column.
            copy: the trick's own lines as its section ran them, for ``what_to_copy`` (default: none).
            helped: whether the trick helped in this run, a bool computed from it (e.g. ``saved > 0``); default:
                read from the comparison's outcome (faster). Needed for ``copy=`` on a row not read from one.

        Raises:
            TypeError: a mapping with a key that is not a string, or a result of another type.
            ValueError: ``before`` does not fill the table's extra columns, an empty mapping, both ``variant``
                and ``variants``, ``variant``/``variants``/``against`` for a result that is not a comparison,
                or ``replicates=True`` for a result without replicates (or read from several variants), or
                ``copy=`` on a row that is not read from a comparison without ``helped=``.
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
        if variant is not None and variants is not None:
            raise ValueError(f"add({trick!r}, ...): pass variant= (one) or variants= (several), not both")
        if not isinstance(result, Comparison) and (variant, variants, against) != (None, None, None):
            raise ValueError(f"add({trick!r}, ...): variant=, variants= and against= read a Comparison only")
        speedup, device, source = None, "-", None  # source: the comparison variants it read, when it read some
        if isinstance(result, Comparison):
            source = read_variants(result, [variant] if variant is not None else variants, against=against)
            measured, speedup, device = source.text(), source.speedup, result.device
        elif isinstance(result, ComparisonRow):
            source = VariantsReading(None, None, (result,))
            measured, speedup, device = source.text(), result.speedup, result.measurement.device
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
            if source is None or len(source.rows) != 1 or not source.rows[0].replicate_speedups:
                raise ValueError(
                    f"add({trick!r}, ..., replicates=True) reads one variant of a comparison run with "
                    "compare(..., replicates=n)"
                )
            note = f" (each replicate: {', '.join(f'{s:.2f}x' for s in source.rows[0].replicate_speedups)})" + note
        outcome = None if source is None else source.outcome
        copy, helped, helped_from = _copy_lines(trick, copy, helped, outcome)
        row = VerdictRow(
            trick, measured + note, caveat, device, speedup, outcome, before, self.columns[1:-1], source,
            copy, helped, helped_from,
        )  # fmt: skip
        self.rows.append(row)
        if self.record_results and isinstance(result, (Comparison, MemoryReport)):
            if not any(seen is result for seen in self._recorded):
                self._recorded.append(result)
                record(trick, result)
        if self.record_rows:
            record(trick, row)
        return row

    def what_to_copy(self) -> CopyList:
        """The notebook's last cell: the lines of every row with ``copy=`` that helped in this run, then the ones
        that did not, each with what it measured and why it does not help.

        Raises:
            ValueError: no row has lines to copy.
        """
        return copy_list(self.rows)

    def _body(self) -> list[list[str]]:
        return [[r.trick, *r.before, r.measured, r.caveat] for r in self.rows]

    def to_markdown(self) -> str:
        return markdown_table(list(self.columns), self._body())

    def to_html(self) -> str:
        return html_table(list(self.columns), self._body())

    # Markdown only (no _repr_html_): Jupyter would prefer HTML, whose escaping shows `code` and **bold**
    # in the cells literally. The rows' outcomes and what each read go with it as the output's metadata, so a
    # test can check every stored closing row against the comparison it names (tests/project/test_closing_rows.py).
    def _repr_markdown_(self) -> tuple[str, dict]:
        return self.to_markdown(), {"tricks_lib": {"verdict_rows": [r.to_dict() for r in self.rows]}}

    def __repr__(self) -> str:
        return self.to_markdown()


def _copy_lines(trick: str, copy: str, helped: bool | None, outcome: Outcome | None) -> tuple[str, bool | None, str]:
    """(lines, helped, where helped came from) for ``add(..., copy=, helped=)``, validated."""
    if not isinstance(copy, str):
        raise TypeError(f"add({trick!r}, ..., copy=): the lines to copy must be a string, got {type(copy).__name__}")
    if helped is not None and not isinstance(helped, bool):
        raise TypeError(f"add({trick!r}, ..., helped=) must be a bool computed from this run, got {helped!r}")
    copy = textwrap.dedent(copy).strip("\n").rstrip()
    if not copy:
        return "", helped, "computed" if helped is not None else ""
    if helped is not None:
        return copy, helped, "computed"
    if outcome is None:
        raise ValueError(
            f"add({trick!r}, ..., copy=...): this row is not read from a comparison, so pass helped= with a bool "
            "computed from this run (e.g. helped=saved_bytes > 0)"
        )
    return copy, outcome is Outcome.FASTER, "outcome"


def _labelled_values(trick: str, values: Mapping[str, object]) -> str:
    """'copy avoided: 16.0 MiB; the copy took: 3.1 ms': a mapping of computed values as one cell's text."""
    if not values:
        raise ValueError(f"add({trick!r}, {{}}, ...): the mapping of computed values is empty")
    for label in values:
        if not isinstance(label, str):
            raise TypeError(f"add({trick!r}, mapping, ...): every label must be a string, got {label!r}")
    return "; ".join(f"{label}: {value}" for label, value in values.items())
