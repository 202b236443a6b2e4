"""Fake-quantized weights at 1, 2 (ternary), 4 and 8 bits, trained with a straight-through estimator.

Each forward pass rounds the weights of every Linear and Conv2d to a few levels; the backward pass
treats the rounding as the identity (the straight-through estimator of Bengio et al. 2013), so the
full-precision weights keep learning. The schemes, per output channel:

- 1 bit (BNN / XNOR-Net): ``sign(w) * mean(|w|)``: two levels.
- 2 bits (ternary, TWN, Li & Liu 2016): 0 below the threshold ``0.7 * mean(|w|)``, else
  ``sign(w) * alpha`` with ``alpha`` the mean magnitude of the weights above it: three levels.
- 4 and 8 bits (uniform symmetric, as in DoReFa-Net's k-bit weights): ``round(w / s) * s`` with
  ``s = max(|w|) / (2 ** (bits - 1) - 1)``: at most ``2 ** bits - 1`` levels.

The weights stay float32 tensors: this measures what the accuracy costs, not what speed low-bit
kernels would give (stock PyTorch has no 1/2/4-bit conv or matmul kernels for them).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["SUPPORTED_BITS", "WeightFakeQuant", "fake_quantize", "fake_quantize_weights"]

SUPPORTED_BITS = (1, 2, 4, 8)
_TWN_THRESHOLD = 0.7  # Li & Liu's approximation of the optimal ternary threshold, times mean(|w|)


def _check_bits(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, one of {SUPPORTED_BITS}, got {type(bits).__name__}")
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    return bits


def _quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The quantized values of ``w`` (no gradient path), per output channel (dim 0)."""
    flat = w.detach().reshape(w.shape[0], -1)  # (C_out, everything else)
    if bits == 1:
        q = torch.where(flat >= 0, 1.0, -1.0) * flat.abs().mean(1, keepdim=True)
    elif bits == 2:
        delta = _TWN_THRESHOLD * flat.abs().mean(1, keepdim=True)
        keep = flat.abs() > delta
        alpha = (flat.abs() * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp(min=1)
        q = torch.sign(flat) * keep * alpha
    else:
        scale = flat.abs().amax(1, keepdim=True).clamp(min=1e-12) / (2 ** (bits - 1) - 1)
        q = torch.round(flat / scale) * scale
    return q.reshape(w.shape).to(w.dtype)


def fake_quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """``w`` rounded to ``bits``-bit levels per output channel, with a straight-through gradient.

    Forward: the quantized values. Backward: the gradient passes to ``w`` unchanged.

    Raises:
        TypeError / ValueError: ``bits`` is not one of ``SUPPORTED_BITS``; ``w`` is not a tensor of at
            least one dimension.
    """
    _check_bits(bits)
    if not isinstance(w, torch.Tensor) or w.dim() == 0:
        raise TypeError("w must be a weight tensor with an output-channel dimension first")
    # q + (w - w.detach()): exactly q in value (w - w is 0 bit for bit), gradient 1 with respect to w.
    # The common w + (q - w).detach() rounds and leaves values a few ulps off the levels.
    return _quantize(w, bits) + (w - w.detach())


class WeightFakeQuant(nn.Module):
    """A parametrization (``torch.nn.utils.parametrize``) that fake-quantizes a weight on every access."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = _check_bits(bits)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return fake_quantize(w, self.bits)

    def extra_repr(self) -> str:
        return f"bits={self.bits}"


def fake_quantize_weights(model: nn.Module, bits: int) -> nn.Module:
    """A copy of ``model`` whose Linear and Conv2d weights are fake-quantized to ``bits`` bits.

    Biases, BatchNorm and activations stay in full precision (as in the BNN/TWN/DoReFa papers, which
    also keep the first and last layers' precision choices to the user). Train the copy as usual: the
    optimizer updates the latent full-precision weights (``module.parametrizations.weight.original``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``bits`` is not one of ``SUPPORTED_BITS``, or the model has no Linear/Conv2d.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fake_quantize_weights needs an nn.Module, got {type(model).__name__}")
    _check_bits(bits)
    copied = copy.deepcopy(model)
    layers = [m for m in copied.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not layers:
        raise ValueError("the model has no nn.Linear or nn.Conv2d weights to quantize")
    for layer in layers:
        parametrize.register_parametrization(layer, "weight", WeightFakeQuant(bits))
    return copied
