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

TRT-ViT-style hybrid networks (Xia et al. 2022): ``hybrid_net(stages, mid=...)`` builds a two-stage
network of conv, transformer or hybrid (transformer then conv) blocks; ``hybrid_nets()`` builds the
``HYBRID_LAYOUTS`` comparisons (transformer blocks early vs late, shallow-then-deep vs the reverse,
hybrid vs pure transformer blocks late) with the hidden width of each chosen for equal FLOPs.

``probe_input(net, batch)`` makes a matching input; ``trend_against_paper(paper_ratio, row)`` reads a
measured comparison row against the paper's throughput ratio ("holds", "weaker", "inverts", "no
measurable effect"); ``SHUFFLENET_V2_TABLES`` holds the paper's
throughputs (GPU: GTX 1080Ti, batches/s; ARM: Snapdragon 810, one thread, images/s) for the
``x1, x2, x4`` columns of each row, copied from the paper's Tables 1-4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from tricks_lib.formatting import markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow

__all__ = [
    "HYBRID_LAYOUTS",
    "SHUFFLENET_V2_TABLES",
    "ProbeTable",
    "ProbeTrends",
    "bottleneck_net",
    "channel_ratio_net",
    "fragment_net",
    "fragment_width",
    "group_conv_net",
    "group_widths",
    "hybrid_net",
    "hybrid_nets",
    "paper_throughput_ratios",
    "probe_input",
    "ratio_channels",
    "shufflenet_v2_probes",
    "trend_against_paper",
]

DEPTH = 10  # blocks stacked per probe network, as in the paper
PROBE_SIZE = 56  # input height = width, as in the paper

# The paper's numbers, row -> (GPU x1, x2, x4 in batches/s; ARM x1, x2, x4 in images/s).
# Table 2 and 3 head their ARM columns "CPU"; the text says all ARM runs used a Snapdragon 810.
SHUFFLENET_V2_TABLES: dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    "G1": {
        "1:1": ((1480, 723, 232), (76.2, 21.7, 5.3)),
        "1:2": ((1296, 586, 206), (72.9, 20.5, 5.1)),
        "1:6": ((876, 489, 189), (69.1, 17.9, 4.6)),
        "1:12": ((748, 392, 163), (57.6, 15.1, 4.4)),
    },
    "G2": {
        "g=1": ((2451, 1289, 437), (40.0, 10.2, 2.3)),
        "g=2": ((1725, 873, 341), (35.0, 9.5, 2.2)),
        "g=4": ((1026, 644, 338), (32.9, 8.7, 2.1)),
        "g=8": ((634, 445, 230), (27.8, 7.5, 1.8)),
    },
    "G3": {
        "1-fragment": ((2446, 1274, 434), (40.2, 10.1, 2.3)),
        "2-fragment-series": ((1790, 909, 336), (38.6, 10.1, 2.2)),
        "4-fragment-series": ((752, 745, 349), (38.4, 10.1, 2.3)),
        "2-fragment-parallel": ((1537, 803, 320), (33.4, 9.1, 2.2)),
        "4-fragment-parallel": ((691, 572, 292), (35.0, 8.4, 2.1)),
    },
    "G4": {
        "ReLU + shortcut": ((2427, 2066, 1436), (56.7, 16.9, 5.0)),
        "ReLU, no shortcut": ((2647, 2256, 1735), (61.9, 18.8, 5.2)),
        "shortcut, no ReLU": ((2672, 2121, 1458), (57.3, 18.2, 5.1)),
        "neither": ((2842, 2376, 1782), (66.3, 20.2, 5.4)),
    },
}

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


def paper_throughput_ratios(guideline: str, row: str, multiplier: int) -> tuple[float, float]:
    """The paper's throughput of ``row`` over its table's first row, ``(GPU half, ARM half)``.

    Args:
        guideline: "G1" to "G4" (the keys of ``SHUFFLENET_V2_TABLES``).
        row: a row name of that table, e.g. "1:12" or "g=8".
        multiplier: the width column, 1, 2 or 4.

    Raises:
        KeyError: an unknown guideline or row (the message lists the valid ones).
        ValueError: a multiplier other than 1, 2 or 4.
    """
    if guideline not in SHUFFLENET_V2_TABLES:
        raise KeyError(f"guideline must be one of {sorted(SHUFFLENET_V2_TABLES)}, got {guideline!r}")
    table = SHUFFLENET_V2_TABLES[guideline]
    if row not in table:
        raise KeyError(f"{guideline} has rows {list(table)}, got {row!r}")
    if multiplier not in (1, 2, 4):
        raise ValueError(f"multiplier must be 1, 2 or 4 (the paper's width columns), got {multiplier!r}")
    column = {1: 0, 2: 1, 4: 2}[multiplier]
    first = next(iter(table.values()))
    gpu, arm = (table[row][half][column] / first[half][column] for half in (0, 1))
    return gpu, arm


def trend_against_paper(paper_ratio: float, row: ComparisonRow) -> str:
    """How this machine's throughput ratio (``row.speedup``, against the table's first row) reads the paper's.

    Returns one of: "holds" (significant, same direction, at least as strong), "weaker" (significant,
    same direction, smaller), "inverts" (significant, the other direction), "not significant here"
    (the run cannot tell: read the comparison's interval, not the paper). Where the paper measured no
    difference (a ratio of exactly 1, as some of its rows do): "no effect in the paper, none here" or
    "no effect in the paper, one here".

    Raises:
        TypeError: ``row`` is not a ``ComparisonRow``.
        ValueError: ``paper_ratio`` is not a positive number.
    """
    if not isinstance(row, ComparisonRow):
        raise TypeError(f"row must be a ComparisonRow (a row of compare()'s result), got {type(row).__name__}")
    if isinstance(paper_ratio, bool) or not isinstance(paper_ratio, (int, float)) or not paper_ratio > 0:
        raise ValueError(f"paper_ratio must be a positive throughput ratio, got {paper_ratio!r}")
    if paper_ratio == 1:
        return "no effect in the paper, one here" if row.significant else "no effect in the paper, none here"
    if not row.significant:
        return "not significant here"
    if (row.speedup > 1) != (paper_ratio > 1):
        return "inverts"
    return "holds" if abs(math.log(row.speedup)) >= abs(math.log(paper_ratio)) else "weaker"


@dataclass(frozen=True)
class ProbeTable:
    """One ShuffleNet V2 table timed here: each row's FLOPs, MAC, the paper's two ratios, this run's, the trend.

    Ratios are throughputs relative to the table's first row (the comparison's baseline); the trend
    reads this run against the paper's half that matches the device (``trend_against_paper``).
    """

    guideline: str
    multiplier: int
    gpu_half: bool  # compared with the paper's GPU half (else its ARM half)
    comparison: Comparison
    flops: dict[str, int]
    mac: dict[str, int]

    def paper_ratio(self, name: str) -> float:
        """The paper's throughput ratio for ``name`` in the half this run is compared with."""
        gpu, arm = paper_throughput_ratios(self.guideline, name, self.multiplier)
        return gpu if self.gpu_half else arm

    def trend(self, name: str) -> str:
        return trend_against_paper(self.paper_ratio(name), self.comparison[name])

    def note(self, name: str) -> str:
        """The paper's ratio for ``name`` (this device's half) and the trend, as a verdict-table note."""
        half = "GPU" if self.gpu_half else "ARM"
        return f"; paper {half} {self.paper_ratio(name):.2f}x, trend: {self.trend(name)}"

    def rows(self, *, with_counts: bool = True) -> list[list[str]]:
        out = []
        for name in self.comparison.names:
            row, (gpu, arm) = self.comparison[name], paper_throughput_ratios(self.guideline, name, self.multiplier)
            cells = [name, f"{gpu:.2f}x", f"{arm:.2f}x", f"{row.speedup:.2f}x", row.verdict,
                     "-" if row.is_baseline else self.trend(name)]  # fmt: skip
            if with_counts:
                cells[1:1] = [f"{self.flops[name] / 1e6:.0f}", f"{self.mac[name] / 1e6:.2f}"]
            out.append(cells)
        return out

    def _repr_markdown_(self) -> str:
        half = "GPU" if self.gpu_half else "ARM"
        header = [
            "row",
            "MFLOPs",
            "MAC (M)",
            "paper GPU",
            "paper ARM",
            "here",
            "verdict here",
            f"trend vs paper {half}",
        ]
        caption = f"{self.guideline}, width x{self.multiplier}: throughput relative to the first row"
        return markdown_table(header, self.rows(), caption=caption)


@dataclass(frozen=True)
class ProbeTrends:
    """Every timed table's rows (first rows left out) side by side with the paper's ratios: one Markdown table."""

    tables: tuple[ProbeTable, ...]

    def _repr_markdown_(self) -> str:
        body = [
            [f"{t.guideline} x{t.multiplier}", *cells] for t in self.tables for cells in t.rows(with_counts=False)[1:]
        ]
        device = self.tables[0].comparison.device if self.tables else "-"
        header = ["table", "row vs first row", "paper GPU", "paper ARM", f"here ({device})", "verdict here", "trend"]
        return markdown_table(header, body)

    def plot(self, ax=None):
        """Each row's median time against its MAC, both relative to its table's first row. Returns the Axes.

        Within a table the FLOPs are equal, so a FLOP model predicts every point at 1x; the x label
        gives the widest FLOP difference of any table.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.8))
        spread = max((max(t.flops.values()) / min(t.flops.values()) - 1 for t in self.tables), default=0.0)
        for t in self.tables:
            cmp_, first = t.comparison, t.comparison.baseline
            xs = [t.mac[n] / t.mac[first] for n in cmp_.names]
            ys = [cmp_[n].measurement.median / cmp_[first].measurement.median for n in cmp_.names]
            ax.plot(xs, ys, marker="o", linestyle="none", label=f"{t.guideline} x{t.multiplier}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel(f"MAC relative to the table's first row (FLOPs equal within {spread:.1%})")
        ax.set_ylabel("time relative to the first row")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return ax


# ---------------------------------------------------------------------------------------------------
# TRT-ViT-style hybrid networks (Xia et al. 2022): where transformer blocks go, at equal FLOPs.


class _ConvBlock(nn.Module):
    """Residual bottleneck on ``(B, c, H, W)``: 1x1 ``c -> mid``, 3x3 ``mid -> mid``, 1x1 ``mid -> c``, BN and ReLU."""

    def __init__(self, c: int, mid: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, padding=1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, c, 1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class _TransformerBlock(nn.Module):
    """Pre-norm transformer block (self-attention, then an MLP of ``mid`` hidden units) on the ``H*W`` positions.

    Attention is written as two matmuls rather than ``nn.MultiheadAttention`` or
    ``scaled_dot_product_attention``: their fused kernels are invisible to ``FlopCounterMode`` on a
    CPU (it counts 0 FLOPs for them), and FLOP-matched comparisons need every FLOP counted.
    """

    def __init__(self, c: int, mid: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.mlp = nn.Sequential(nn.Linear(c, mid), nn.GELU(), nn.Linear(mid, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)  # (B, N, C) tokens, N = H*W
        q, k, v = self.qkv(self.norm1(t)).view(b, h * w, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads), dim=-1)  # (B, heads, N, N)
        t = t + self.proj((scores @ v).transpose(1, 2).reshape(b, h * w, c))
        t = t + self.mlp(self.norm2(t))
        return t.transpose(1, 2).reshape(b, c, h, w)


_BLOCKS = ("conv", "transformer", "hybrid")


def _block(kind: str, c: int, mid: int, heads: int) -> nn.Module:
    if kind == "conv":
        return _ConvBlock(c, mid)
    if kind == "transformer":
        return _TransformerBlock(c, mid, heads)
    # TRT-ViT's block-level rule, "early Transformer and late CNN": a transformer block, then a conv block
    return nn.Sequential(_TransformerBlock(c, mid, heads), _ConvBlock(c, mid))


def hybrid_net(
    stages: tuple[tuple[str, int], tuple[str, int]],
    *,
    mid: int,
    widths: tuple[int, int] = (64, 128),
    heads: int = 4,
    num_classes: int = 10,
) -> nn.Sequential:
    """A two-stage hybrid network for ``(B, 3, H, W)`` images: stem (stride 4), stage 1, downsample (stride 2), stage 2, head.

    Args:
        stages: ``((kind, depth), (kind, depth))`` per stage; kind is "conv", "transformer" or "hybrid".
        mid: hidden width of every block (conv bottleneck width, transformer MLP width); the knob
            ``hybrid_nets`` turns to give networks equal FLOPs.
        widths: channels of the two stages (each a multiple of ``heads``).
        heads: attention heads.
        num_classes: outputs of the linear head.

    Raises:
        TypeError / ValueError: malformed stages, unknown kinds, non-positive sizes.
    """
    if not (
        isinstance(stages, tuple) and len(stages) == 2 and all(isinstance(s, tuple) and len(s) == 2 for s in stages)
    ):
        raise TypeError(f"stages must be ((kind, depth), (kind, depth)), got {stages!r}")
    for kind, depth in stages:
        if kind not in _BLOCKS:
            raise ValueError(f"block kind must be one of {_BLOCKS}, got {kind!r}")
        _check_width(depth, "depth")
    for name, value in (
        ("mid", mid),
        ("heads", heads),
        ("num_classes", num_classes),
        *zip(("width 1", "width 2"), widths),
    ):
        _check_width(value, name)
    if any(w % heads for w in widths):
        raise ValueError(f"widths {widths} must be multiples of heads={heads}")
    (kind1, depth1), (kind2, depth2) = stages
    c1, c2 = widths
    return nn.Sequential(
        nn.Conv2d(3, c1, 4, stride=4, bias=False),  # (B, c1, H/4, W/4)
        nn.BatchNorm2d(c1),
        *[_block(kind1, c1, mid, heads) for _ in range(depth1)],
        nn.Conv2d(c1, c2, 2, stride=2, bias=False),  # (B, c2, H/8, W/8)
        nn.BatchNorm2d(c2),
        *[_block(kind2, c2, mid, heads) for _ in range(depth2)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(c2, num_classes),  # (B, num_classes)
    )


# The TRT-ViT-style comparisons: name -> stages. The first is the reference whose FLOPs the others match.
HYBRID_LAYOUTS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "conv early, transformer late": (("conv", 2), ("transformer", 2)),
    "transformer early, conv late": (("transformer", 2), ("conv", 2)),
    "shallow then deep (1, 3)": (("conv", 1), ("transformer", 3)),
    "deep then shallow (3, 1)": (("conv", 3), ("transformer", 1)),
    "hybrid blocks late": (("conv", 2), ("hybrid", 1)),
}


def hybrid_nets(image_size: int = 64, *, reference_mid: int = 128, max_mid: int = 1024) -> dict[str, nn.Sequential]:
    """The ``HYBRID_LAYOUTS`` networks, each with the ``mid`` that brings its FLOPs closest to the first one's.

    All layouts share the stem, downsampling and head, so only their blocks' FLOPs must agree; each
    block kind's FLOPs are counted with ``count_flops`` at its stage's resolution for an
    ``image_size`` image (attention's cost depends on the number of positions, so the match holds
    for that size). Weights are drawn from torch's RNG.

    Raises:
        TypeError / ValueError: non-int or non-positive sizes, or an image smaller than 8x8.
    """
    from tricks_lib.design.flops import count_flops  # here, not at import: flops is a sibling module

    for name, value in (("image_size", image_size), ("reference_mid", reference_mid), ("max_mid", max_mid)):
        _check_width(value, name)
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 (the network downsamples by 8), got {image_size}")
    widths, sides = (64, 128), (image_size // 4, image_size // 8)
    cache: dict[tuple[str, int, int], int] = {}

    def block_flops(kind: str, stage: int, mid: int) -> int:
        key = (kind, stage, mid)
        if key not in cache:
            x = torch.zeros(1, widths[stage], sides[stage], sides[stage])
            cache[key] = count_flops(_block(kind, widths[stage], mid, 4), x)
        return cache[key]

    def blocks_flops(stages, mid: int) -> int:
        return sum(depth * block_flops(kind, i, mid) for i, (kind, depth) in enumerate(stages))

    layouts = list(HYBRID_LAYOUTS.items())
    target = blocks_flops(layouts[0][1], reference_mid)
    nets = {layouts[0][0]: hybrid_net(layouts[0][1], mid=reference_mid, widths=widths)}
    for name, stages in layouts[1:]:
        lo, hi = 1, max_mid  # FLOPs grow with mid: bisect for the largest mid at or below the target
        while lo < hi:
            m = (lo + hi + 1) // 2
            lo, hi = (m, hi) if blocks_flops(stages, m) <= target else (lo, m - 1)
        best = min((lo, min(lo + 1, max_mid)), key=lambda m: abs(blocks_flops(stages, m) - target))
        nets[name] = hybrid_net(stages, mid=best, widths=widths)
    return nets
