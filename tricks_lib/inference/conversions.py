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
    """How far a variant's outputs (logits) moved from the reference's, on the same inputs."""

    label: str
    samples: int
    max_abs_error: float  # the largest |candidate - reference| over all logits
    mean_abs_error: float
    reference_scale: float  # the largest |reference| logit, to read the errors against
    top1_agreement: float  # fraction of samples whose arg-max class is the same

    def __repr__(self) -> str:
        return (
            f"OutputError({self.label!r}: max |error| {self.max_abs_error:.3g} (logits up to "
            f"{self.reference_scale:.3g}), mean {self.mean_abs_error:.3g}, top-1 agreement "
            f"{self.top1_agreement:.1%} of {self.samples})"
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
    """Compare a lossy variant's (N, classes) outputs with the reference outputs (computed in float32).

    Raises:
        TypeError: an argument is not a tensor.
        ValueError: the shapes differ or are not (N, classes) with N >= 1.
    """
    for name, value in (("reference", reference), ("candidate", candidate)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor of outputs, got {type(value).__name__}")
    if reference.shape != candidate.shape or reference.dim() != 2 or reference.shape[0] == 0:
        raise ValueError(
            f"reference and candidate must both be (N, classes) outputs, got {tuple(reference.shape)} "
            f"and {tuple(candidate.shape)}"
        )
    ref = reference.detach().float().cpu()
    cand = candidate.detach().float().cpu()
    diff = (cand - ref).abs()
    return OutputError(
        label=label,
        samples=ref.shape[0],
        max_abs_error=float(diff.max()),
        mean_abs_error=float(diff.mean()),
        reference_scale=float(ref.abs().max()),
        top1_agreement=float((ref.argmax(1) == cand.argmax(1)).float().mean()),
    )
