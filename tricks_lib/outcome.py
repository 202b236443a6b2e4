"""What a result says, as a value: the outcome of a paired comparison and the summary row every result renders.

``Outcome`` is computed once, from the paired interval (``ComparisonRow.outcome``); the verdict text, the
summary files, ``tricks_lib diff``, the HTML page, the plots and the verdict helpers read it, never a word
of a sentence. ``SummaryRow`` is the row each result type renders itself into (``result.summary_rows()``),
with the interval and significance filled by the result itself, so the report never repairs a row.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import ClassVar, Protocol

__all__ = ["Outcome", "Summarizable", "SummaryRow"]


class Outcome(str, enum.Enum):
    """What one variant of a comparison measured against its reference.

    A ``str`` enum, so it is written to JSON as its value ("faster") and compares equal to it.
    """

    FASTER = "faster"
    SLOWER = "slower"
    NOT_SIGNIFICANT = "not significant"
    BASELINE = "baseline"
    # Significantly faster although it does strictly more work than another variant
    # (``compare(more_work=)``): an artifact of the measurement, not a speedup.
    SUSPECT = "suspect"

    @classmethod
    def of(cls, speedup: float, significant: bool, *, is_baseline: bool = False, suspect: bool = False) -> Outcome:
        """The outcome of a paired speedup (> 1 is faster) whose interval did or did not clear the threshold."""
        if is_baseline:
            return cls.BASELINE
        if suspect:
            return cls.SUSPECT
        if not significant:
            return cls.NOT_SIGNIFICANT
        return cls.FASTER if speedup > 1 else cls.SLOWER

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SummaryRow:
    """One variant of one measured trick, as the summary lists it (None: not measured for this row)."""

    variant: str
    device: str
    median_s: float | None = None
    iqr_s: float | None = None
    speedup: float | None = None  # against the comparison's baseline; > 1 is faster
    verdict: str | None = None
    items_per_second: float | None = None
    saved_bytes: int | None = None
    peak_saved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    noisy: bool | None = None  # the spread (IQR) is more than 10% of the median: read with care
    # The paired confidence interval of ``speedup`` and whether it clears the comparison's threshold
    # (comparisons only; None for the baseline and for results that are not paired comparisons).
    speedup_low: float | None = None
    speedup_high: float | None = None
    significant: bool | None = None
    # The comparison's typed outcome (``Outcome``'s value); None for results that are not comparisons.
    outcome: str | None = None
    # The smallest effect the comparison ever calls significant (0.05: 5% from 1x); None outside comparisons.
    min_effect: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Summarizable(Protocol):
    """What ``record()`` accepts: a result that names its kind and renders its own summary rows and details."""

    record_kind: ClassVar[str]

    def summary_rows(self) -> tuple[SummaryRow, ...]: ...

    def to_dict(self) -> dict: ...
