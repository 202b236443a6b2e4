"""What ``try_training_tricks`` and ``try_inference_tricks`` take from the reader, checked before anything runs.

A factory must be callable and give the same model (the same weights) on every call, since every trick
starts from a fresh copy and is compared with the baseline's; a batch is a tensor or a tuple of tensors.
Each check raises with the argument's name and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = [
    "as_tensors",
    "batch_on",
    "bf16_reason",
    "channels_last_reason",
    "check_budget",
    "check_factory",
    "check_same_weights",
    "check_tolerances",
    "check_tricks",
    "move",
]


def check_factory(value: object, name: str, example: str, *, takes: str = "no arguments") -> Callable:
    if not callable(value):
        raise TypeError(f"{name} must be a function that takes {takes}, e.g. {example}; got {type(value).__name__}")
    return value


def check_budget(budget_s: object) -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise TypeError(f"budget_s must be a number of seconds, e.g. 60, got {type(budget_s).__name__}")
    if not math.isfinite(budget_s) or not budget_s > 0:
        raise ValueError(f"budget_s must be a positive, finite number of seconds, e.g. 60, got {budget_s!r}")
    return float(budget_s)


def check_tolerances(exact: object, lossy: object) -> None:
    for name, value in (("exact_tolerance", exact), ("lossy_tolerance", lossy)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number (a relative error such as 1e-3), got {type(value).__name__}")
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be a positive relative error, e.g. 1e-3, got {value!r}")


def check_tricks(tricks: Sequence[str] | None, known: Sequence[str]) -> list[str]:
    """The tricks to try, in ``known``'s order (None: all of them)."""
    if tricks is None:
        return list(known)
    if isinstance(tricks, str) or not all(isinstance(t, str) for t in tricks):
        raise TypeError(f"tricks must be a list of trick names such as {list(known[:2])}, got {tricks!r}")
    unknown = [t for t in tricks if t not in known]
    if unknown:
        raise ValueError(f"unknown trick(s) {unknown}; the tricks are {list(known)}")
    return [t for t in known if t in tricks]


def check_same_weights(make_model: Callable[[], nn.Module]) -> None:
    """Two calls of ``make_model`` must give modules with equal parameters and buffers."""
    first, second = make_model(), make_model()
    for model in (first, second):
        if not isinstance(model, nn.Module):
            raise TypeError(f"make_model must return an nn.Module, got {type(model).__name__}")
    a, b = first.state_dict(), second.state_dict()
    differs = [k for k in a if k not in b or a[k].shape != b[k].shape or not torch.equal(a[k].cpu(), b[k].cpu())]
    if differs or set(a) != set(b):
        raise ValueError(
            f"make_model returned different weights on two calls (first difference: {(differs or ['the keys'])[0]}); "
            "each trick starts from a fresh model and is checked against the baseline's: seed inside it, e.g. "
            "torch.manual_seed(0) before building the model"
        )


def as_tensors(value: object, name: str) -> tuple[torch.Tensor, ...]:
    """A tensor or a tuple/list of tensors, as a tuple."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(value)
    raise TypeError(f"{name} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def move(tensors: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device) for t in tensors)


def batch_on(batch: object, device: torch.device) -> tuple[tuple[torch.Tensor, ...], object]:
    """``make_batch()``'s ``(inputs, targets)`` on ``device``: the inputs as a tuple, the targets as ``loss_fn``
    expects them (a tensor, or the tuple or list they came in)."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"make_batch must return (inputs, targets), got {type(batch).__name__}")
    inputs = move(as_tensors(batch[0], "make_batch()[0] (the inputs)"), device)
    targets = move(as_tensors(batch[1], "make_batch()[1] (the targets)"), device)
    return inputs, targets[0] if isinstance(batch[1], torch.Tensor) else type(batch[1])(targets)


def channels_last_reason(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> str | None:
    """Why channels_last cannot apply (no 2-D convolution, no 4-D input), or None."""
    if not any(isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)) for m in model.modules()):
        return "no 2-D convolution in the model"
    if not any(x.dim() == 4 for x in inputs):
        return "no 4-D (N, C, H, W) input"
    return None


def bf16_reason(device: torch.device, cpu_bf16_native: bool, gpu_alternative: str) -> str | None:
    """Why bf16 autocast is not worth trying on ``device`` (emulated there), or None."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return None if major >= 8 else f"this GPU (sm{major}{minor}) emulates bf16; {gpu_alternative}"
    if device.type == "cpu":
        return (
            None
            if cpu_bf16_native
            else "this CPU has no native bf16 (AVX512-BF16 or AMX): it would be emulated, slower"
        )
    return f"bf16 autocast on {device.type} is not tried here"
