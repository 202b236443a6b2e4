"""Knowledge distillation: Hinton, Vinyals and Dean (2015), "Distilling the Knowledge in a Neural Network".

``distillation_loss(student_logits, teacher_logits, targets, temperature=T, alpha=a)`` is

    a * T^2 * KL(softmax(teacher / T) || softmax(student / T))  +  (1 - a) * CE(student, targets)

The soft term is scaled by ``T^2`` because its gradients shrink as ``1 / T^2`` when the logits are
divided by ``T``; the scaling keeps the two terms' relative weight the same when ``T`` changes.
The KL is averaged over the batch (``reduction="batchmean"``, the mathematically correct mean).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["distillation_loss"]


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
