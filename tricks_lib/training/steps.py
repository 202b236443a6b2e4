"""Support for the training notebooks: ``autocast_dtype``, the 16-bit type ``torch.autocast`` should use on a
device (one rule for every notebook).

The training steps themselves are written out in the notebooks, in plain PyTorch (notebook 02's ``make_step``).
"""

from __future__ import annotations

import torch

__all__ = ["autocast_dtype"]


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
