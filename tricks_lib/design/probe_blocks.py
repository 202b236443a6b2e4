"""The probe networks of ShuffleNet V2's four guidelines (Ma et al. 2018, Section 2, Tables 1-4).

Each builder returns a plain ``nn.Sequential`` of 10 stacked blocks for 56x56 inputs, as in the
paper, with channel counts computed so that every variant of one table has the same FLOPs (within
about 1%: channels are whole numbers). Channels are given by a base width ``c`` (the paper's ``x1``
column; ``x2`` and ``x4`` double and quadruple it):

* G1 ``channel_ratio_net(ratio, c)``: blocks of two 1x1 convs ``c1 -> c2 -> c1`` with
  ``c1 : c2 = 1 : ratio`` and ``c1 * c2 ~ c^2`` (Table 1).
* G2 ``group_conv_net(groups, c)``: 10 pointwise group convs whose width grows with the groups so
  that ``width^2 / groups ~ c^2`` (Table 2).
* G3 ``fragment_net(fragments, arrangement, c)``: 1, 2 or 4 1x1 convs per block, in series or in
  parallel, each ``c' -> c'`` with ``fragments * c'^2 ~ c^2`` (Table 3). Parallel branches read the
  same input and their outputs are summed (the paper's appendix figure is not reproduced here; this
  is our construction, and its additions are element-wise work the series blocks do not do).
* G4 ``bottleneck_net(c, relu=..., shortcut=...)``: ResNet bottlenecks ``4c -> c -> c (3x3) -> 4c``
  with ReLU and the identity shortcut switchable (Table 4); removing them leaves the FLOPs unchanged.

``shufflenet_v2_probes(guideline, multiplier)`` builds one table's networks at the paper's widths;
``probe_input(net, batch)`` makes a matching input. The paper's throughputs and the tables that read
this machine's timings against them are in ``probe_tables``; the TRT-ViT-style hybrid networks in
``hybrid_probes``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "bottleneck_net",
    "channel_ratio_net",
    "fragment_net",
    "fragment_width",
    "group_conv_net",
    "group_widths",
    "probe_input",
    "ratio_channels",
    "shufflenet_v2_probes",
]

DEPTH = 10  # blocks stacked per probe network, as in the paper
PROBE_SIZE = 56  # input height = width, as in the paper

# The paper's x1 base width per table: (GPU half, ARM half).
_BASE_WIDTH = {"G1": (128, 32), "G2": (128, 64), "G3": (128, 64), "G4": (32, 32)}


def _check_width(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _conv1x1(c_in: int, c_out: int, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, groups=groups, bias=False)


def ratio_channels(ratio: int, c: int) -> tuple[int, int]:
    """``(c1, c2)`` with ``c2 / c1 ~ ratio`` and ``c1 * c2 ~ c^2`` (the FLOPs of a ``c -> c`` conv)."""
    c1 = max(1, round(c / math.sqrt(ratio)))
    return c1, max(1, round(c * c / c1))


def channel_ratio_net(ratio: int, c: int, *, depth: int = DEPTH) -> nn.Sequential:
    """G1 probe: ``depth`` blocks of two 1x1 convs, ``c1 -> c2`` then ``c2 -> c1``, ``c1 : c2 = 1 : ratio``.

    Raises:
        TypeError / ValueError: a non-int or non-positive size.
    """
    for name, value in (("ratio", ratio), ("c", c), ("depth", depth)):
        _check_width(value, name)
    c1, c2 = ratio_channels(ratio, c)
    return nn.Sequential(*[nn.Sequential(_conv1x1(c1, c2), _conv1x1(c2, c1)) for _ in range(depth)])


def group_widths(groups: int, c: int) -> tuple[int, int]:
    """Two widths, multiples of ``groups`` and at most ``groups`` apart, with ``a * b / groups ~ c^2``.

    The layers alternate ``a -> b -> a``; where one width fits (``a == b``) all layers are ``a -> a``.
    """
    target = c * c * groups
    low = max(groups, (math.isqrt(target) // groups) * groups)
    candidates = [(low, low), (low, low + groups), (low + groups, low + groups)]
    return min(candidates, key=lambda ab: abs(ab[0] * ab[1] - target))


def group_conv_net(groups: int, c: int, *, depth: int = DEPTH) -> nn.Sequential:
    """G2 probe: ``depth`` pointwise group convs with ``groups`` groups and the FLOPs of ``c -> c`` dense ones.

    Raises:
        TypeError / ValueError: a non-int or non-positive size.
    """
    for name, value in (("groups", groups), ("c", c), ("depth", depth)):
        _check_width(value, name)
    a, b = group_widths(groups, c)
    layers = [_conv1x1(a, b, groups) if i % 2 == 0 else _conv1x1(b, a, groups) for i in range(depth)]
    return nn.Sequential(*layers)


class _ParallelSum(nn.Module):
    """Branches that read the same input; their outputs are added."""

    def __init__(self, branches: list[nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branches[0](x)
        for branch in self.branches[1:]:
            out = out + branch(x)
        return out


def fragment_width(fragments: int, c: int) -> int:
    """Width ``c'`` of each of ``fragments`` convs with ``fragments * c'^2 ~ c^2``."""
    return max(1, round(c / math.sqrt(fragments)))


def fragment_net(fragments: int, arrangement: str, c: int, *, depth: int = DEPTH) -> nn.Sequential:
    """G3 probe: ``depth`` blocks of ``fragments`` 1x1 convs in ``"series"`` or ``"parallel"``.

    Raises:
        TypeError / ValueError: a non-int or non-positive size, or another arrangement.
    """
    for name, value in (("fragments", fragments), ("c", c), ("depth", depth)):
        _check_width(value, name)
    if arrangement not in ("series", "parallel"):
        raise ValueError(f"arrangement must be 'series' or 'parallel', got {arrangement!r}")
    width = fragment_width(fragments, c)

    def block() -> nn.Module:
        convs = [_conv1x1(width, width) for _ in range(fragments)]
        if fragments == 1:
            return convs[0]
        return nn.Sequential(*convs) if arrangement == "series" else _ParallelSum(convs)

    return nn.Sequential(*[block() for _ in range(depth)])


class _Bottleneck(nn.Module):
    """ResNet bottleneck without BatchNorm: 1x1 ``4c -> c``, 3x3 ``c -> c``, 1x1 ``c -> 4c``."""

    def __init__(self, c: int, relu: bool, shortcut: bool) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(4 * c, c, 1, bias=False)
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.expand = nn.Conv2d(c, 4 * c, 1, bias=False)
        self.relu, self.shortcut = relu, shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = torch.relu if self.relu else (lambda t: t)
        out = self.expand(act(self.conv(act(self.reduce(x)))))
        if self.shortcut:
            out = out + x
        return act(out)


def bottleneck_net(c: int, *, relu: bool = True, shortcut: bool = True, depth: int = DEPTH) -> nn.Sequential:
    """G4 probe: ``depth`` ResNet bottlenecks of ``c`` channels (``4c`` in and out), ReLU and shortcut switchable.

    Raises:
        TypeError / ValueError: a non-int or non-positive size, or non-bool switches.
    """
    for name, value in (("c", c), ("depth", depth)):
        _check_width(value, name)
    for name, value in (("relu", relu), ("shortcut", shortcut)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return nn.Sequential(*[_Bottleneck(c, relu, shortcut) for _ in range(depth)])


def shufflenet_v2_probes(guideline: str, multiplier: int = 1, *, gpu_half: bool = False) -> dict[str, nn.Sequential]:
    """The probe networks of one table, row name -> network, at the paper's width for the GPU or ARM half.

    Args:
        guideline: "G1", "G2", "G3" or "G4".
        multiplier: 1, 2 or 4 (the table's x1, x2, x4 columns: the base width times this).
        gpu_half: the GPU half's widths (its x1 is wider) instead of the ARM half's.

    Raises:
        ValueError: an unknown guideline or multiplier.
    """
    if guideline not in _BASE_WIDTH:
        raise ValueError(f"guideline must be one of {list(_BASE_WIDTH)}, got {guideline!r}")
    if multiplier not in (1, 2, 4):
        raise ValueError(f"multiplier must be 1, 2 or 4 (the paper's columns), got {multiplier!r}")
    c = _BASE_WIDTH[guideline][0 if gpu_half else 1] * multiplier
    if guideline == "G1":
        return {f"1:{r}": channel_ratio_net(r, c) for r in (1, 2, 6, 12)}
    if guideline == "G2":
        return {f"g={g}": group_conv_net(g, c) for g in (1, 2, 4, 8)}
    if guideline == "G3":
        return {
            "1-fragment": fragment_net(1, "series", c),
            "2-fragment-series": fragment_net(2, "series", c),
            "4-fragment-series": fragment_net(4, "series", c),
            "2-fragment-parallel": fragment_net(2, "parallel", c),
            "4-fragment-parallel": fragment_net(4, "parallel", c),
        }
    return {
        "ReLU + shortcut": bottleneck_net(c, relu=True, shortcut=True),
        "ReLU, no shortcut": bottleneck_net(c, relu=True, shortcut=False),
        "shortcut, no ReLU": bottleneck_net(c, relu=False, shortcut=True),
        "neither": bottleneck_net(c, relu=False, shortcut=False),
    }


def probe_input(net: nn.Module, batch: int = 1, *, size: int = PROBE_SIZE, seed: int = 0) -> torch.Tensor:
    """A seeded ``(batch, C, size, size)`` input whose ``C`` is the first convolution's input channels.

    Raises:
        TypeError / ValueError: a non-int or non-positive size; ValueError when ``net`` has no Conv2d.
    """
    _check_width(batch, "batch")
    _check_width(size, "size")
    conv = next((m for m in net.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None:
        raise ValueError("net has no Conv2d to read the input channels from")
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, conv.in_channels, size, size, generator=generator)
