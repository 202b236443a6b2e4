"""Inference-time model rewrites, and how far a rewritten model's outputs moved.

- ``reparameterize(model)``: a new model with every ``RepVGGBlock`` replaced by its deploy form.
- ``output_error(reference, candidate)``: the largest and mean absolute logit error and the top-1
  agreement of a lossy variant (lower precision, quantization) against the fp32 outputs.
"""

from __future__ import annotations

import copy
import html
from dataclasses import dataclass

import torch
from torch import nn

from tricks_lib.inference.repvgg import RepVGGBlock

__all__ = ["OutputError", "output_error", "reparameterize"]


def _check_eval_model(model: object, what: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} needs an nn.Module, got {type(model).__name__}")
    training = [name or "the model" for name, m in model.named_modules() if m.training]
    if training:
        raise ValueError(
            f"{what} is only valid in eval mode (BatchNorm must use its running statistics), but "
            f"{training[0]} is in training mode: call model.eval() first"
        )


def reparameterize(model: nn.Module) -> nn.Module:
    """A new eval-mode model with every ``RepVGGBlock`` replaced by its deploy form (one 3x3 conv + ReLU).

    Args:
        model: an ``nn.Module`` in eval mode (a ``RepVGGBlock`` itself, or a model containing some).
            It is left unchanged.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` or one of its submodules is in training mode.
    """
    _check_eval_model(model, "reparameterize")
    if isinstance(model, RepVGGBlock):
        return model.reparameterize()
    copied = copy.deepcopy(model)
    for module in list(copied.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RepVGGBlock):
                setattr(module, name, child.reparameterize())
    return copied.eval()


@dataclass(frozen=True)
class OutputError:
    """How far a variant's outputs moved from the reference's, on the same inputs (any shape: logits,
    embeddings, images, a regression's values)."""

    label: str
    samples: int  # the size of the first dimension (1 for a scalar output)
    max_abs_error: float  # the largest |candidate - reference| over all values
    mean_abs_error: float
    reference_scale: float  # the largest |reference| value, to read the errors against
    top1_agreement: float | None  # (N, classes) logits: share of samples with the same arg-max; else None

    @property
    def max_relative_error(self) -> float:
        """``max_abs_error / reference_scale`` (inf where the reference is all zeros)."""
        return self.max_abs_error / self.reference_scale if self.reference_scale else float("inf")

    def __repr__(self) -> str:
        agreement = "" if self.top1_agreement is None else f", top-1 agreement {self.top1_agreement:.1%}"
        return (
            f"OutputError({self.label!r}: max |error| {self.max_abs_error:.3g} (values up to "
            f"{self.reference_scale:.3g}), mean {self.mean_abs_error:.3g}{agreement} of {self.samples})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "samples": self.samples,
            "max_abs_error": self.max_abs_error,
            "mean_abs_error": self.mean_abs_error,
            "reference_scale": self.reference_scale,
            "top1_agreement": self.top1_agreement,
        }


def output_error(reference: torch.Tensor, candidate: torch.Tensor, *, label: str = "candidate") -> OutputError:
    """Compare a lossy variant's outputs with the reference outputs, of any shape (computed in float32).

    (N, classes) outputs also get the top-1 agreement; other shapes (embeddings, images, per-sample
    values) get the errors only.

    Raises:
        TypeError: an argument is not a tensor, or holds complex values.
        ValueError: the shapes differ, or the outputs are empty.
    """
    for name, value in (("reference", reference), ("candidate", candidate)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor of outputs, got {type(value).__name__}")
        if value.is_complex():
            raise TypeError(f"{name} holds complex values: compare their real and imaginary parts separately")
    if reference.shape != candidate.shape or reference.numel() == 0:
        raise ValueError(
            f"reference and candidate must be outputs of the same, non-empty shape, got {tuple(reference.shape)} "
            f"and {tuple(candidate.shape)}"
        )
    ref = reference.detach().float().cpu()
    cand = candidate.detach().float().cpu()
    diff = (cand - ref).abs()
    return OutputError(
        label=label,
        samples=ref.shape[0] if ref.dim() else 1,
        max_abs_error=float(diff.max()),
        mean_abs_error=float(diff.mean()),
        reference_scale=float(ref.abs().max()),
        top1_agreement=float((ref.argmax(1) == cand.argmax(1)).float().mean()) if ref.dim() == 2 else None,
    )
