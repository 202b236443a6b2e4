"""Support for the training notebooks: the autocast type for a device, and accuracy under inference mode.

* ``autocast_dtype``: the 16-bit type ``torch.autocast`` should use on a device (one rule for every notebook).
* ``evaluate_accuracy``: top-1 accuracy under ``torch.inference_mode`` and ``model.eval()``.

The training steps themselves are written out in the notebooks, in plain PyTorch (notebook 02's ``make_step``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["autocast_dtype", "evaluate_accuracy"]


@torch.inference_mode()
def evaluate_accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on ``(inputs, targets)`` in eval mode under ``torch.inference_mode``.

    The model is put in eval mode for the evaluation and restored to its previous mode afterwards.

    Returns:
        Accuracy in [0, 1] (one host sync at the end).

    Raises:
        ValueError: for mismatched lengths, an empty set or ``batch_size < 1``.
    """
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"inputs ({inputs.shape[0]}) and targets ({targets.shape[0]}) differ in length")
    if inputs.shape[0] == 0 or batch_size < 1:
        raise ValueError("need a non-empty set and batch_size >= 1")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
    model.train(was_training)
    return correct.item() / inputs.shape[0]


def autocast_dtype(device: str | torch.device) -> torch.dtype:
    """The 16-bit type for ``torch.autocast`` on ``device``: one rule for every notebook.

    CUDA: bfloat16 from compute capability 8.0 (Ampere) on, where it is native and needs no
    GradScaler; float16 before (bf16 is emulated there). CPU: bfloat16, the type CPU autocast is
    built for (fast with AVX512-BF16 or AMX, correct but slow without: ``describe().cpu_bf16_native``
    says which). MPS: float16.

    Raises:
        ValueError: ``device`` is not a device string or ``torch.device``.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a device such as 'cpu' or 'cuda', got {device!r}") from err
    if dev.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(dev) >= (8, 0) else torch.float16
    if dev.type == "mps":
        return torch.float16
    return torch.bfloat16
