"""TRT-ViT-style hybrid networks (Xia et al. 2022): where transformer blocks go, at equal FLOPs.

``hybrid_net(stages, mid=...)`` builds a two-stage network of conv, transformer or hybrid
(transformer then conv) blocks; ``hybrid_nets()`` builds the ``HYBRID_LAYOUTS`` comparisons
(transformer blocks early vs late, shallow-then-deep vs the reverse, hybrid vs pure transformer
blocks late) with the hidden width of each chosen for equal FLOPs.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tricks_lib._validate import check_positive

__all__ = ["HYBRID_LAYOUTS", "hybrid_net", "hybrid_nets"]


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
    ``scaled_dot_product_attention``, so the ops that are timed are the ops that ``count_flops`` counts
    (a fused kernel's count comes from a formula, and its inference fast path from none at all).
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
        check_positive(depth, "depth", allow_none=False, integer=True)
    for name, value in (
        ("mid", mid),
        ("heads", heads),
        ("num_classes", num_classes),
        *zip(("width 1", "width 2"), widths),
    ):
        check_positive(value, name, allow_none=False, integer=True)
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
        check_positive(value, name, allow_none=False, integer=True)
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
