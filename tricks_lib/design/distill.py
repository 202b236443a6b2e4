"""Knowledge distillation (Hinton, Vinyals and Dean 2015): reading its gain over seeds.

The loss itself, ``alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE``, is
written out in notebook 04. Here: ``paired_gain_verdict`` reads per-seed gains (distilled minus alone, same
seed) with a t-interval of their mean, and ``distillation_gains`` collects every run's accuracies per seed
into ``DistillationGains``, which reads each scenario and renders the tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tricks_lib.formatting import markdown_table

__all__ = ["DistillationGains", "distillation_gains", "paired_gain_verdict"]


def paired_gain_verdict(gains, *, confidence: float = 0.95) -> tuple[str, float, float, float]:
    """Read per-seed paired gains (distilled minus alone, same seed) with a t-interval of their mean.

    Args:
        gains: one number per seed, at least two.
        confidence: two-sided confidence of the interval, in ``(0, 1)``.

    Returns:
        ``(verdict, mean, low, high)``: "helps" when the whole interval lies above 0, "hurts" when it
        lies below 0, else "no significant effect"; then the mean gain and the interval's bounds.

    Raises:
        TypeError: ``gains`` is not a sequence of numbers, or ``confidence`` is not a number.
        ValueError: fewer than two gains, a non-finite gain, or ``confidence`` outside ``(0, 1)``.
    """
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise TypeError(f"confidence must be a number, got {confidence!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (0.95 is usual), got {confidence!r}")
    try:
        values = np.asarray(gains, dtype=float).ravel()
    except (TypeError, ValueError):
        raise TypeError(f"gains must be a sequence of numbers, got {type(gains).__name__}") from None
    if values.size < 2:
        raise ValueError(f"gains needs at least two seeds for a spread, got {values.size}: run more seeds")
    if not np.isfinite(values).all():
        raise ValueError("gains must all be finite numbers")
    mean = float(values.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    low, high = mean - half, mean + half
    verdict = "helps" if low > 0 else "hurts" if high < 0 else "no significant effect"
    return verdict, mean, low, high


@dataclass(frozen=True)
class DistillationGains:
    """Per-seed test accuracies of every run, and each scenario's paired gain (distilled minus alone).

    Runs are named ``"<scenario>, alone"`` and ``"<scenario>, distilled"``; other runs (a teacher)
    appear in the accuracy table only. Renders as two Markdown tables.
    """

    accuracies: Mapping[str, tuple[float, ...]]  # run -> test accuracy per seed (the same seeds for every run)
    scenarios: tuple[str, ...]
    confidence: float

    def gain(self, scenario: str) -> np.ndarray:
        """Per-seed accuracy of the distilled student minus the student alone, for one scenario."""
        return np.asarray(self.accuracies[f"{scenario}, distilled"]) - np.asarray(self.accuracies[f"{scenario}, alone"])

    def verdict(self, scenario: str) -> tuple[str, float, float, float]:
        """``paired_gain_verdict`` of the scenario's gains: (verdict, mean, low, high)."""
        return paired_gain_verdict(self.gain(scenario), confidence=self.confidence)

    def summary(self, scenario: str) -> str:
        """The scenario's reading in one line, for a verdict table."""
        verdict, mean, low, high = self.verdict(scenario)
        seeds = len(self.gain(scenario))
        return (f"{verdict}: {mean * 100:+.1f} accuracy points ({self.confidence:.0%} interval "
                f"{low * 100:+.1f} to {high * 100:+.1f}, {seeds} seeds)")  # fmt: skip

    def accuracy_table(self) -> str:
        seeds = max(len(v) for v in self.accuracies.values())
        rows = [[name, f"{np.mean(a):.1%} ± {np.std(a, ddof=1):.1%}", f"{min(a):.1%} - {max(a):.1%}"]
                for name, a in self.accuracies.items()]  # fmt: skip
        return markdown_table(["run", f"test accuracy, mean ± sd over {seeds} seeds", "min - max"], rows)

    def gain_table(self) -> str:
        rows = []
        for scenario in self.scenarios:
            verdict, mean, low, high = self.verdict(scenario)
            gain = self.gain(scenario)
            rows.append([scenario, f"{mean * 100:+.1f} points", f"{low * 100:+.1f} to {high * 100:+.1f}",
                         f"{gain.min() * 100:+.1f} / {gain.max() * 100:+.1f}", verdict])  # fmt: skip
        header = ["scenario", "distilled minus alone (mean)", f"{self.confidence:.0%} interval", "worst / best seed",
                  "reading"]  # fmt: skip
        return markdown_table(header, rows)

    def _repr_markdown_(self) -> str:
        return self.accuracy_table() + "\n\n" + self.gain_table()

    def __repr__(self) -> str:
        return self._repr_markdown_()


def distillation_gains(
    accuracies: Mapping[str, Sequence[float]], scenarios: Sequence[str], *, confidence: float = 0.95
) -> DistillationGains:
    """Collect per-seed accuracies and read each scenario's distillation gain (see ``DistillationGains``).

    Raises:
        KeyError: a scenario lacks its ``", alone"`` or ``", distilled"`` run.
        ValueError: runs with different numbers of seeds, or fewer than two seeds (``paired_gain_verdict``).
    """
    runs = {name: tuple(float(a) for a in values) for name, values in accuracies.items()}
    for scenario in scenarios:
        for kind in ("alone", "distilled"):
            if f"{scenario}, {kind}" not in runs:
                raise KeyError(f"no run named {scenario + ', ' + kind!r}; the runs are {sorted(runs)}")
    if len({len(v) for v in runs.values()}) > 1:
        raise ValueError("every run needs one accuracy per seed, the same seeds for every run")
    gains = DistillationGains(runs, tuple(scenarios), confidence)
    for scenario in scenarios:
        gains.verdict(scenario)  # validates the seeds and the confidence now, not at display time
    return gains
