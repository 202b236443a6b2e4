"""Small models for quick, honest training measurements.

* ``SmallCNN``: a plain conv-BN-ReLU stack for 32x32 images (CIFAR-sized), optionally with the
  redundant conv bias before BatchNorm and optionally without BatchNorm (for exact gradient checks).
* ``ResNet``: a CIFAR-style residual network (3 stages, strides 1-2-2) for 32x32 images.
* ``MLP``: a fully connected network, for tabular inputs and flattened images.
* ``drop_conv_bias_before_bn``: removes the bias of every conv followed by BatchNorm and folds it
  into the BatchNorm's running mean, so eval-mode outputs are unchanged.
* ``count_parameters``: number of (trainable) parameters.

All constructors take their sizes as arguments and draw initial weights from torch's global RNG, so
seed before building a model when runs must be comparable.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tricks_lib._validate import check_non_negative_int, check_positive

__all__ = [
    "MLP",
    "ResNet",
    "SmallCNN",
    "count_parameters",
    "drop_conv_bias_before_bn",
]


def _check_positive_int(name: str, value: object) -> int:
    check_positive(value, name, allow_none=False, integer=True)
    return value


def _conv_block(c_in: int, c_out: int, *, stride: int, bias: bool, batch_norm: bool) -> nn.Sequential:
    """conv3x3 -> (BatchNorm) -> ReLU, as one Sequential so the conv/BN pair is easy to find."""
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=bias)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(c_out))
    layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Four conv blocks and a linear head for (B, C, 32, 32) images (any H, W >= 8 works).

    Args:
        num_classes: outputs of the final linear layer.
        width: channels of the first block; later blocks use 2x and 4x this.
        in_channels: input channels (3 for RGB).
        conv_bias: give every conv a bias. Before BatchNorm the bias is redundant (BN subtracts the
            batch mean, which removes any constant); it is on by default in ``nn.Conv2d``.
        batch_norm: put a BatchNorm after each conv. Turn it off when per-sample independence is
            needed (BatchNorm mixes the samples of a batch, so gradient accumulation is not exact).

    Raises:
        TypeError / ValueError: for non-int or non-positive sizes.
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        width: int = 32,
        in_channels: int = 3,
        conv_bias: bool = False,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        _check_positive_int("width", width)
        _check_positive_int("in_channels", in_channels)
        bias = bool(conv_bias) or not batch_norm  # without BN the bias is not redundant
        w = width
        self.features = nn.Sequential(
            _conv_block(in_channels, w, stride=1, bias=bias, batch_norm=batch_norm),  # (B, w, 32, 32)
            _conv_block(w, 2 * w, stride=2, bias=bias, batch_norm=batch_norm),  # (B, 2w, 16, 16)
            _conv_block(2 * w, 4 * w, stride=2, bias=bias, batch_norm=batch_norm),  # (B, 4w, 8, 8)
            _conv_block(4 * w, 4 * w, stride=2, bias=bias, batch_norm=batch_norm),  # (B, 4w, 4, 4)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)  # (B, 4w, 1, 1)
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.head(torch.flatten(x, 1))  # (B, num_classes)


class _BasicBlock(nn.Module):
    """Two conv3x3-BN layers with an identity (or 1x1 conv) shortcut, as in He et al. 2016."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet for (B, C, 32, 32) images: a stem, three stages (strides 1, 2, 2), a head.

    ``ResNet(blocks_per_stage=3, widths=(16, 32, 64))`` is ResNet-20 of He et al. 2016.

    Args:
        num_classes: outputs of the final linear layer.
        widths: channels of the three stages.
        blocks_per_stage: residual blocks per stage.
        in_channels: input channels.

    Raises:
        TypeError / ValueError: for a malformed ``widths`` or non-positive sizes.
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        widths: tuple[int, int, int] = (16, 32, 64),
        blocks_per_stage: int = 1,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        _check_positive_int("blocks_per_stage", blocks_per_stage)
        _check_positive_int("in_channels", in_channels)
        if not isinstance(widths, (tuple, list)) or len(widths) != 3:
            raise ValueError(f"widths must be a tuple of 3 ints, got {widths!r}")
        for w in widths:
            _check_positive_int("widths[i]", w)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        c_in = widths[0]
        for i, c_out in enumerate(widths):
            blocks = []
            for j in range(blocks_per_stage):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(_BasicBlock(c_in, c_out, stride))
                c_in = c_out
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)  # (B, widths[2], H/4, W/4)
        self.head = nn.Linear(widths[2], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)  # (B, widths[2])
        return self.head(x)


class MLP(nn.Module):
    """Linear-ReLU layers: ``in_features -> hidden x depth -> out_features``; flattens its input.

    Args:
        in_features: size of one flattened input sample.
        out_features: outputs.
        hidden: width of each hidden layer.
        depth: number of hidden layers (0 gives a single linear layer).

    Raises:
        TypeError / ValueError: for non-int or out-of-range sizes.
    """

    def __init__(self, in_features: int, out_features: int, *, hidden: int = 256, depth: int = 2) -> None:
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("out_features", out_features)
        _check_positive_int("hidden", hidden)
        check_non_negative_int(depth, "depth")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.flatten(x, 1))  # (B, out_features)


def drop_conv_bias_before_bn(model: nn.Module) -> nn.Module:
    """Return a copy of ``model`` without the bias of any ``Conv2d`` directly followed by ``BatchNorm2d``.

    The pairs are found as adjacent children of ``nn.Sequential`` containers. In training mode
    BatchNorm subtracts the batch mean, which cancels a constant per-channel bias exactly; in eval
    mode it subtracts ``running_mean``, so the bias is folded in as ``running_mean -= bias``, and the
    eval-mode outputs of the copy equal those of the original up to float rounding.

    Args:
        model: any module; it is not modified.

    Returns:
        A deep copy with the redundant biases removed (``conv.bias is None``).

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    model = copy.deepcopy(model)
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq)
        for conv, bn in zip(children, children[1:]):
            if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
                continue
            if conv.bias is None:
                continue
            if bn.track_running_stats and bn.running_mean is not None:
                with torch.no_grad():
                    bn.running_mean -= conv.bias.detach().to(bn.running_mean.dtype)
            conv.bias = None  # drops the Parameter and the "bias" entry of the state dict
    return model


def count_parameters(model: nn.Module, *, trainable_only: bool = True) -> int:
    """Number of scalar parameters of ``model`` (only those with ``requires_grad`` by default).

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
