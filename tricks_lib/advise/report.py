"""The report of ``try_training_tricks`` / ``try_inference_tricks``: one row per trick considered.

A row says whether the trick applies here (or why not), what its check found (passed, or the measured
error against its bound, or the error it raised), and, for the tricks that ran, the outcome of the
interleaved comparison against the baseline with its paired interval and the memory saved for
backward. ``recommended`` holds only tricks that passed their check and were significantly faster
(or, with a memory budget, fit it); ``stacked`` measures them together; ``code()`` gives their lines.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import ClassVar

from tricks_lib.formatting import format_bytes, markdown_table
from tricks_lib.measurements import Comparison
from tricks_lib.outcome import Outcome

__all__ = ["AdviceReport", "TrickRow"]


@dataclass(frozen=True)
class TrickRow:
    """One trick as the report saw it."""

    name: str
    applies: bool
    reason: str = ""  # why it does not apply, or what it raised
    check: str = "-"  # "passed (...)", "failed: ..." or "-" (not run)
    check_passed: bool = False
    outcome: Outcome | None = None  # of the interleaved comparison against the baseline
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    saved_bytes: int | None = None  # saved for backward in one step (training) / one call
    peak_allocated_bytes: int | None = None  # CUDA: the call's own peak
    lines: str = ""  # the lines to add to the reader's loop
    note: str = ""  # e.g. a compile's first-call cost and break-even
    errors: tuple[tuple[str, float], ...] = ()  # the check's relative errors: ("loss", ...), ("gradients", ...), ...

    @property
    def effect(self) -> str:
        if not self.applies:
            return f"does not apply: {self.reason}"
        if not self.check_passed:
            return self.check
        if self.speedup is None:
            return "not timed"
        interval = ""
        if self.speedup_low is not None and self.speedup_high is not None:
            interval = f" [{self.speedup_low:.2f}-{self.speedup_high:.2f}]"
        word = {Outcome.FASTER: "faster", Outcome.SLOWER: "slower"}.get(self.outcome, "not significant")
        return f"{self.speedup:.2f}x{interval}, {word}"


@dataclass(frozen=True)
class AdviceReport:
    """Every trick considered for one model on one device, measured against the same baseline."""

    kind: str  # "training" or "inference"
    device: str
    rows: tuple[TrickRow, ...]
    comparison: Comparison | None  # baseline and every trick that passed its check, interleaved
    stacked: Comparison | None  # baseline vs the recommended tricks together (None: nothing recommended)
    stacked_check: str
    budget_s: float
    seconds_used: float
    memory_budget_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())
    baseline_saved_bytes: int | None = None  # the baseline step's saved-for-backward bytes (training, when timed)
    batch_sizes: Comparison | str | None = None  # training with batch_sizes=: throughput per batch size, or why not

    # Tricks that replace each other (one autocast type, one optimizer kernel): at most one of each is recommended.
    CLASHES: ClassVar[tuple[frozenset[str], ...]] = (
        frozenset({"bf16 autocast", "fp16 autocast + GradScaler", "fp16 autocast"}),
        frozenset({"foreach optimizer", "fused optimizer"}),
        frozenset({"no_grad", "inference_mode"}),
    )

    @property
    def recommended(self) -> tuple[TrickRow, ...]:
        """Tricks that passed their check and were significantly faster, or (with a memory budget) save memory
        against the baseline and fit the budget; of tricks that replace each other, the fastest only."""

        def fits(row: TrickRow) -> bool:
            return (
                self.memory_budget_bytes is not None
                and row.saved_bytes is not None
                and self.baseline_saved_bytes is not None
                and row.saved_bytes < self.baseline_saved_bytes
                and row.saved_bytes <= self.memory_budget_bytes
            )

        chosen = [r for r in self.rows if r.check_passed and (r.outcome is Outcome.FASTER or fits(r))]
        for group in self.CLASHES:
            rivals = [r for r in chosen if r.name in group]
            if len(rivals) > 1:
                best = max(rivals, key=lambda r: r.speedup or 0.0)
                chosen = [r for r in chosen if r.name not in group or r is best]
        return tuple(chosen)

    def code(self) -> str:
        """The lines to add for the recommended tricks, each under a comment with its measured effect."""
        if not self.recommended:
            return "# nothing to add: no trick passed its check and was significantly faster here\n"
        parts = [f"# {r.name}: {r.effect}\n{r.lines.strip()}\n" for r in self.recommended if r.lines.strip()]
        return "\n".join(parts)

    def _table_rows(self) -> list[list[str]]:
        return [
            [
                r.name,
                "yes" if r.applies else "no",
                r.check if r.applies else r.reason,
                r.effect if r.applies and r.check_passed else "-",
                format_bytes(r.saved_bytes) if r.saved_bytes is not None else "-",
                r.note or "-",
            ]
            for r in self.rows
        ]

    _HEADER = (
        "trick",
        "applies",
        "check (or why not)",
        "time vs baseline [paired interval]",
        "saved for backward",
        "note",
    )

    def _stacked_line(self) -> str:
        if self.stacked is None:
            return "Stacked: nothing to stack (no trick passed its check and was significantly faster)."
        row = self.stacked["stacked"]
        return f"Stacked ({', '.join(r.name for r in self.recommended)}): {row.verdict}; check {self.stacked_check}."

    def _batch_line(self) -> str:
        if self.batch_sizes is None:
            return ""
        if isinstance(self.batch_sizes, str):
            return f"Batch sizes: {self.batch_sizes}."
        parts = [
            f"{r.name}: {r.measurement.items_per_second:,.0f} samples/s ({r.verdict})" for r in self.batch_sizes.rows
        ]
        return "Batch sizes, baseline step by throughput: " + "; ".join(parts) + "."

    def _repr_markdown_(self) -> str:
        head = (
            f"**{self.kind.capitalize()} tricks on {self.device}** ({self.seconds_used:.0f} s of a "
            f"{self.budget_s:.0f} s budget)\n\n"
        )
        notes = "".join(f"\n- {n}" for n in self.notes)
        batch = f"\n\n{self._batch_line()}" if self.batch_sizes is not None else ""
        return (
            head
            + markdown_table(self._HEADER, self._table_rows())
            + "\n\n"
            + self._stacked_line()
            + batch
            + notes
            + "\n"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>" for cells in self._table_rows()
        )
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (
            f"<p><b>{html.escape(self.kind.capitalize())} tricks on {html.escape(self.device)}</b> "
            f"({self.seconds_used:.0f} s of a {self.budget_s:.0f} s budget)</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
            f"<p>{html.escape(self._stacked_line())}</p>"
            + (f"<p>{html.escape(self._batch_line())}</p>" if self.batch_sizes is not None else "")
            + (f"<ul>{notes}</ul>" if notes else "")
        )

    def __str__(self) -> str:
        return self._repr_markdown_()
