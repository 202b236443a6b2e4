"""Knowledge distillation: Hinton, Vinyals and Dean (2015), "Distilling the Knowledge in a Neural Network".

``distillation_loss(student_logits, teacher_logits, targets, temperature=T, alpha=a)`` is

    a * T^2 * KL(softmax(teacher / T) || softmax(student / T))  +  (1 - a) * CE(student, targets)

The soft term is scaled by ``T^2`` because its gradients shrink as ``1 / T^2`` when the logits are
divided by ``T``; the scaling keeps the two terms' relative weight the same when ``T`` changes.
The KL is averaged over the batch (``reduction="batchmean"``, the mathematically correct mean).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from tricks_lib.formatting import markdown_table

__all__ = ["DistillationGains", "distillation_gains", "distillation_loss", "paired_gain_verdict"]


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor | None,
    *,
    temperature: float,
    alpha: float,
) -> torch.Tensor:
    """Hinton's distillation loss: ``alpha`` times the softened KL (times ``T^2``) plus ``1 - alpha`` times CE.

    Args:
        student_logits: ``(N, classes)`` logits of the model being trained.
        teacher_logits: ``(N, classes)`` logits of the teacher (detached here: no gradient reaches it).
        targets: ``(N,)`` class indices for the hard term; may be None only when ``alpha == 1`` (an
            unlabelled batch: the teacher's soft labels are the only signal).
        temperature: ``T > 0``; higher spreads the teacher's probability over more classes.
        alpha: weight of the soft term, in ``[0, 1]``; 0 gives plain cross-entropy.

    Returns:
        A scalar tensor.

    Raises:
        TypeError: logits that are not tensors, or a non-number temperature/alpha.
        ValueError: ``temperature <= 0`` (or not finite), ``alpha`` outside ``[0, 1]``, mismatched
            shapes, or ``targets=None`` with ``alpha < 1``.
    """
    for name, value in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    for name, value in (("temperature", temperature), ("alpha", alpha)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number (Hinton et al. use 1-20), got {temperature!r}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha weights the soft term and must lie in [0, 1], got {alpha!r}")
    if student_logits.dim() != 2 or student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits must both be (N, classes), got {tuple(student_logits.shape)} and "
            f"{tuple(teacher_logits.shape)}"
        )
    if targets is None and alpha < 1:
        raise ValueError("targets=None (an unlabelled batch) needs alpha=1: the hard term has no labels to use")
    loss = student_logits.new_zeros(())
    if alpha > 0:
        log_p_student = F.log_softmax(student_logits / temperature, dim=1)
        log_p_teacher = F.log_softmax(teacher_logits.detach() / temperature, dim=1)
        soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
        loss = loss + alpha * temperature**2 * soft
    if alpha < 1:
        loss = loss + (1 - alpha) * F.cross_entropy(student_logits, targets)
    return loss


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
