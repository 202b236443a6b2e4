"""Inference-time model rewrites, and how far a rewritten model's outputs moved.

- ``fuse_conv_bn(model)``: a new eval-mode model with every Conv2d -> BatchNorm2d pair folded into
  one conv (``torch.nn.utils.fusion.fuse_conv_bn_eval``), found with ``torch.fx``; models that FX
  cannot trace fall back to a traversal of ``nn.Sequential`` containers.
- ``reparameterize(model)``: a new model with every ``RepVGGBlock`` replaced by its deploy form.
- ``output_error(reference, candidate)``: the largest and mean absolute logit error and the top-1
  agreement of a lossy variant (lower precision, quantization) against the fp32 outputs.
- ``serialized_size(model)``: bytes of ``torch.save(model.state_dict())``, the size on disk.
"""

from __future__ import annotations

import copy
import html
import io
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from tricks_lib.inference.repvgg import RepVGGBlock

__all__ = ["OutputError", "count_modules", "fuse_conv_bn", "output_error", "reparameterize", "serialized_size"]


def _check_eval_model(model: object, what: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} needs an nn.Module, got {type(model).__name__}")
    training = [name or "the model" for name, m in model.named_modules() if m.training]
    if training:
        raise ValueError(
            f"{what} is only valid in eval mode (BatchNorm must use its running statistics), but "
            f"{training[0]} is in training mode: call model.eval() first"
        )


def _foldable(conv: nn.Module, bn: nn.Module) -> bool:
    # A BN without running statistics normalizes by the batch even in eval mode: nothing to fold.
    return (
        type(conv) is nn.Conv2d
        and type(bn) is nn.BatchNorm2d
        and bn.track_running_stats
        and bn.running_mean is not None
        and conv.out_channels == bn.num_features
    )


def _fuse_with_fx(model: nn.Module) -> fx.GraphModule:
    traced = fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    calls: dict[str, int] = {}
    for node in traced.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in list(traced.graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
            continue
        conv_node = node.args[0]
        if conv_node.op != "call_module" or len(conv_node.users) != 1:
            continue  # the conv's raw output is used elsewhere too: folding would change that use
        conv, bn = modules[conv_node.target], modules[node.target]
        if not _foldable(conv, bn) or calls[conv_node.target] != 1:
            continue  # a conv module called twice would be changed for its other call too
        fused = fuse_conv_bn_eval(conv, bn)
        parent_name, _, attr = conv_node.target.rpartition(".")
        setattr(traced.get_submodule(parent_name) if parent_name else traced, attr, fused)
        modules[conv_node.target] = fused
        node.replace_all_uses_with(conv_node)
        traced.graph.erase_node(node)
    traced.graph.lint()
    traced.delete_all_unused_submodules()
    traced.recompile()
    return traced


def _fuse_in_sequentials(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        names = list(module._modules)
        for first, second in zip(names, names[1:]):
            conv, bn = module._modules[first], module._modules[second]
            if conv is not None and bn is not None and _foldable(conv, bn):
                module._modules[first] = fuse_conv_bn_eval(conv, bn)
                module._modules[second] = nn.Identity()
    return model


def fuse_conv_bn(model: nn.Module) -> nn.Module:
    """A new eval-mode model with every Conv2d -> BatchNorm2d pair folded into one Conv2d.

    The BatchNorm's scale and shift become the conv's weight and bias (``fuse_conv_bn_eval``), so one
    kernel and one pass over memory disappear per pair. Pairs are found in the ``torch.fx`` graph (any
    conv whose only use is a BatchNorm, wherever the modules live); a model FX cannot trace (data-
    dependent control flow) is searched for adjacent pairs inside ``nn.Sequential`` containers instead.
    Pairs that cannot be folded are left as they are: a BatchNorm without running statistics, a conv
    whose output is also used elsewhere, a conv module called more than once.

    Args:
        model: an ``nn.Module`` in eval mode (every submodule). It is left unchanged.

    Returns:
        A new module in eval mode (an ``fx.GraphModule`` when tracing worked, else a copy of the model).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` or one of its submodules is in training mode.
    """
    _check_eval_model(model, "fuse_conv_bn")
    copied = copy.deepcopy(model)
    try:
        fused = _fuse_with_fx(copied)
    except (fx.proxy.TraceError, TypeError, NotImplementedError, RuntimeError):
        fused = _fuse_in_sequentials(copy.deepcopy(model))
    return fused.eval()


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


def count_modules(model: nn.Module, kind: type[nn.Module] | tuple[type[nn.Module], ...]) -> int:
    """How many submodules of ``model`` (itself included) are instances of ``kind``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_modules needs an nn.Module, got {type(model).__name__}")
    return sum(isinstance(m, kind) for m in model.modules())


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


def serialized_size(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: the model's size on disk (quantized tensors included).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"serialized_size needs an nn.Module, got {type(model).__name__}")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()
