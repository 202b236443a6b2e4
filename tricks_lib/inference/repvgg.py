"""RepVGG: a multi-branch block for training that becomes one 3x3 convolution for deployment.

Ding et al., "RepVGG: Making VGG-style ConvNets Great Again" (CVPR 2021). During training a block
sums three branches, each followed by BatchNorm: a 3x3 conv, a 1x1 conv, and (when input and output
shapes match) the identity. In eval mode every branch is linear, so their sum is one 3x3 conv with a
bias: the 1x1 kernel is zero-padded to 3x3, the identity is a 3x3 kernel with a 1 at the centre of
its own channel, and each BatchNorm folds into its branch's kernel and bias.
"""

from __future__ import annotations

import torch
from torch import nn

from tricks_lib._validate import check_positive

__all__ = ["RepVGGBlock"]


def _conv_bn(c_in: int, c_out: int, kernel_size: int, stride: int) -> nn.Sequential:
    """conv (no bias: BatchNorm follows) -> BatchNorm, padded so both kernel sizes give the same shape."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(c_out),
    )


def _fold_bn(kernel: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel and bias of ``bn(conv(x))`` for a bias-free conv with ``kernel`` (eval-mode BN statistics)."""
    std = (bn.running_var + bn.eps).sqrt()
    scale = bn.weight / std  # (C_out,)
    return kernel * scale.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * scale


class RepVGGBlock(nn.Module):
    """The training-time RepVGG block: ReLU(BN(conv3x3(x)) + BN(conv1x1(x)) [+ BN(x)]).

    Args:
        in_channels / out_channels: channels in and out.
        stride: 1 or 2; the identity branch exists only with stride 1 and equal channel counts.

    Raises:
        TypeError / ValueError: non-int or non-positive sizes, a stride other than 1 or 2.
    """

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            check_positive(value, name, allow_none=False, integer=True)
        if stride not in (1, 2) or isinstance(stride, bool):
            raise ValueError(f"stride must be 1 or 2, got {stride!r}")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.branch_3x3 = _conv_bn(in_channels, out_channels, 3, stride)  # (B, C_out, H/s, W/s)
        self.branch_1x1 = _conv_bn(in_channels, out_channels, 1, stride)
        self.identity = nn.BatchNorm2d(in_channels) if in_channels == out_channels and stride == 1 else None
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch_3x3(x) + self.branch_1x1(x)
        if self.identity is not None:
            out = out + self.identity(x)
        return self.relu(out)

    @torch.no_grad()
    def equivalent_kernel_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (C_out, C_in, 3, 3) kernel and (C_out,) bias of the single conv equal to the three branches.

        Uses the BatchNorm running statistics, so it equals the block in eval mode only.
        """
        k3, b3 = _fold_bn(self.branch_3x3[0].weight, self.branch_3x3[1])
        # A 1x1 kernel is a 3x3 kernel with zeros around its centre (padding 1 vs 0 keeps shapes equal).
        k1, b1 = _fold_bn(nn.functional.pad(self.branch_1x1[0].weight, [1, 1, 1, 1]), self.branch_1x1[1])
        kernel, bias = k3 + k1, b3 + b1
        if self.identity is not None:
            eye = torch.zeros_like(kernel)
            eye[torch.arange(self.in_channels), torch.arange(self.in_channels), 1, 1] = 1.0
            ki, bi = _fold_bn(eye, self.identity)
            kernel, bias = kernel + ki, bias + bi
        return kernel, bias

    def reparameterize(self) -> nn.Module:
        """The deploy form: a new ``Sequential(conv3x3 with bias, ReLU)`` equal to this block in eval mode.

        This block is left unchanged.

        Raises:
            ValueError: the block is in training mode (BatchNorm would use batch statistics, which no
                fixed kernel reproduces): call ``.eval()`` first.
        """
        if self.training:
            raise ValueError("reparameterize() needs eval mode (BatchNorm running statistics): call .eval() first")
        kernel, bias = self.equivalent_kernel_bias()
        ref = self.branch_3x3[0]
        conv = nn.Conv2d(self.in_channels, self.out_channels, 3, stride=self.stride, padding=1, bias=True)
        conv = conv.to(device=ref.weight.device, dtype=ref.weight.dtype)
        with torch.no_grad():
            conv.weight.copy_(kernel)
            conv.bias.copy_(bias)
        return nn.Sequential(conv, nn.ReLU()).eval()

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, stride={self.stride}, identity={self.identity is not None}"
