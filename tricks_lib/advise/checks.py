"""The checks a trick passes before it is timed: the same loss, gradients and update as the baseline's.

One step of each variant from the same weights on the same batch gives its loss, its gradients (unscaled,
before the optimizer reads them) and its parameter update. A lossless trick (another memory layout,
another optimizer kernel, a compiled graph) may only reorder float arithmetic, so each of the three
must match the baseline's within ``exact`` (relative); a lossy one (16-bit autocast, TF32) within
``lossy``, and the report states the measured error either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["StepResult", "StepCheck", "check_step", "relative_error"]


@dataclass(frozen=True)
class StepResult:
    """What one checked step produced: its loss, its gradients and its parameter update (all on the CPU, fp32)."""

    loss: torch.Tensor
    grads: tuple[torch.Tensor, ...]
    update: tuple[torch.Tensor, ...]


def relative_error(found, reference) -> float:
    """``||found - reference|| / ||reference||`` over tensors (or lists of them), as one float32 vector."""
    if isinstance(found, torch.Tensor):
        found, reference = (found,), (reference,)
    num = math.sqrt(sum(float(((f.float() - r.float()) ** 2).sum()) for f, r in zip(found, reference)))
    den = math.sqrt(sum(float((r.float() ** 2).sum()) for r in reference))
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


@dataclass(frozen=True)
class StepCheck:
    """A trick's step against the baseline's: the largest relative error of loss, gradients and update."""

    loss_error: float
    grad_error: float
    update_error: float
    bound: float

    @property
    def error(self) -> float:
        return max(self.loss_error, self.grad_error, self.update_error)

    @property
    def passed(self) -> bool:
        return self.error <= self.bound

    def text(self) -> str:
        word = "passed" if self.passed else "failed"
        return (
            f"{word}: largest relative error {self.error:.1e} (bound {self.bound:.0e}; loss {self.loss_error:.1e}, "
            f"gradients {self.grad_error:.1e}, update {self.update_error:.1e})"
        )


def check_step(found: StepResult, reference: StepResult, bound: float) -> StepCheck:
    if len(found.grads) != len(reference.grads):
        raise ValueError(
            f"the trick's model has {len(found.grads)} parameters with gradients, the baseline's {len(reference.grads)}"
        )
    return StepCheck(
        loss_error=relative_error(found.loss, reference.loss),
        grad_error=relative_error(found.grads, reference.grads),
        update_error=relative_error(found.update, reference.update),
        bound=bound,
    )
