"""How a fix moved a training step's phase split.

- ``phase_shift(before, after)``: how a fix moved the split, phase by phase, as a ``PhaseShift``.

The splits are ``PhaseSplit`` results of ``phase_split`` (module ``phases``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tricks_lib._validate import check_positive
from tricks_lib.formatting import format_seconds, html_table, markdown_table
from tricks_lib.profiling.phases import PhaseSplit

__all__ = ["PhaseShift", "phase_shift"]


@dataclass(frozen=True)
class PhaseShift:
    """How a change moved a loop's split: each phase's share (timers) before and after.

    A phase ``moved`` when its share changed by more than ``tolerance`` (a fraction) and by more
    than both splits' own timer-vs-profiler disagreement. ``focus`` is the phase the verdict reads
    (None: the one that changed most).
    """

    change: str
    before: PhaseSplit
    after: PhaseSplit
    tolerance: float
    focus: str | None = None

    @property
    def changes(self) -> dict[str, float]:
        """Per phase (of either split): share after minus share before (fractions)."""
        b, a = self.before.timer_shares, self.after.timer_shares
        return {name: a.get(name, 0.0) - b.get(name, 0.0) for name in dict.fromkeys([*b, *a])}

    @property
    def threshold(self) -> float:
        """The smallest share change that counts as a move."""
        return max(self.tolerance, self.before.disagreement, self.after.disagreement)

    @property
    def moved(self) -> dict[str, bool]:
        return {name: abs(c) > self.threshold for name, c in self.changes.items()}

    @property
    def largest(self) -> str:
        """The phase whose share changed most."""
        changes = self.changes
        return max(changes, key=lambda name: abs(changes[name]))

    @property
    def verdict(self) -> str:
        """One computed line: the focus phase's change (or the largest), whether it moved, the bounds, items/s."""
        name = self.focus or self.largest
        change = self.changes[name]
        b, a = self.before.timer_shares.get(name, 0.0), self.after.timer_shares.get(name, 0.0)
        moved = "moved" if self.moved[name] else f"did not move (within {100 * self.threshold:.0f} pt)"
        rates = (self.before.items_per_second, self.after.items_per_second)
        rate = "" if None in rates else f"; items/s {rates[1] / rates[0]:.2f}x"
        return (
            f"{name} {b:.0%} -> {a:.0%} of the step ({100 * change:+.0f} pt): the split {moved}; "
            f"{self.before.bound} -> {self.after.bound}{rate}"
        )

    def _table(self) -> tuple[list[str], list[list[str]], str]:
        header = ["phase", "share before", "share after", "change", "moved"]
        b, a = self.before.timer_shares, self.after.timer_shares
        body = [
            [name, f"{b.get(name, 0.0):.0%}", f"{a.get(name, 0.0):.0%}", f"{100 * c:+.1f} pt",
             "yes" if self.moved[name] else "no"]
            for name, c in self.changes.items()
        ]  # fmt: skip
        caption = (
            f"{self.change}: {self.before.label} -> {self.after.label}; per step "
            f"{format_seconds(self.before.step_s)} -> {format_seconds(self.after.step_s)}; "
            f"a move is a change over {100 * self.threshold:.1f} pt"
        )
        return header, body, caption

    def _repr_markdown_(self) -> str:
        return markdown_table(*self._table())

    def _repr_html_(self) -> str:
        return html_table(*self._table())

    def __repr__(self) -> str:
        return f"PhaseShift({self.change!r}: {self.verdict})"


def phase_shift(
    before: PhaseSplit, after: PhaseSplit, *, change: str, tolerance: float = 0.05, focus: str | None = None
) -> PhaseShift:
    """Compare two splits of one loop, before and after ``change``.

    Args:
        before, after: ``PhaseSplit`` results (their phases may differ; a missing phase has share 0).
        change: what changed, for the caption (e.g. ``"2 workers, prefetch 4"``).
        tolerance: the share change (a fraction; 0.05 = 5 percentage points) below which a phase
            did not move; the splits' own disagreement raises it further.
        focus: the phase the verdict reads (e.g. ``WAIT_PHASE`` for a loader fix); None: the one
            whose share changed most.

    Raises:
        TypeError: ``before``/``after`` is not a ``PhaseSplit``, ``change`` not a non-empty string,
            ``tolerance`` not a number, ``focus`` not a string.
        ValueError: ``tolerance`` not in (0, 1); ``focus`` not a phase of either split.
    """
    for name, value in (("before", before), ("after", after)):
        if not isinstance(value, PhaseSplit):
            raise TypeError(f"{name} must be a PhaseSplit (from phase_split), got {type(value).__name__}")
    if not isinstance(change, str) or not change:
        raise TypeError(f"change must be a non-empty string naming the change, got {change!r}")
    check_positive(tolerance, "tolerance", allow_none=False)
    if tolerance >= 1:
        raise ValueError(f"tolerance is a fraction of the step (0.05 = 5 points), got {tolerance!r}")
    if focus is not None:
        if not isinstance(focus, str):
            raise TypeError(f"focus must be a phase's name, got {focus!r}")
        if focus not in (*before.phases, *after.phases):
            raise ValueError(
                f"focus {focus!r} is not a phase of either split: {sorted({*before.phases, *after.phases})}"
            )
    return PhaseShift(change=change, before=before, after=after, tolerance=float(tolerance), focus=focus)
