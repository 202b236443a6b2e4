"""airbench94's network, as a builder with a width multiplier so that CPU runs stay small.

The network of Keller Jordan's airbench (github.com/KellerJordan/cifar10-airbench, ``airbench94.py``;
paper: "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", 2024, arXiv:2404.00498), scripts that train
CIFAR-10 fast. Its README (2024-2025) gives 94.01% mean accuracy in 2.59 s on one A100 for
``airbench94_muon.py`` (its fastest since November 2024; the Muon optimizer, 8 epochs), and keeps the
paper's scripts under ``legacy/``: 3.83 s eager and 3.09 s compiled (3.29 s in the paper's title), 9.9
epochs. All three train this network. Its layers, for 32x32 RGB inputs at width multiplier 1:

* a 2x2 "whitening" convolution, 3 -> 24 channels, no padding, with a bias (31x31 out), then GELU;
  its weights are set from the training images' patch covariance (``init_whitening``) and frozen;
* three conv groups, widths 64, 256, 256: conv3x3 ("same" padding, no bias, identity (dirac)
  initialization of the first ``c_in`` filters) -> MaxPool2d(2) -> BatchNorm -> GELU -> conv3x3 ->
  BatchNorm -> GELU (31 -> 15 -> 7 -> 3 pixels);
* MaxPool2d(3) (3x3 -> 1x1), flatten, a linear layer 256 -> 10 without bias, outputs times 1/9.

Its BatchNorms have eps 1e-12, momentum 0.4 in PyTorch's convention (airbench's 0.6 is ``1 -
momentum``), and frozen scales (``weight.requires_grad = False``): only their biases train.
1,972,792 parameters at width 1 (airbench's "1.97M"; ``tests/ladder/test_airbench.py`` counts them layer by layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from tricks_lib._validate import check_flag, check_positive
from tricks_lib.formatting import format_seconds, markdown_table

__all__ = [
    "AIRBENCH94_WIDTHS",
    "Airbench94",
    "PUBLISHED_RECORDS",
    "PublishedRecord",
    "RecordComparison",
    "TRAINING_FLOPS_PER_FORWARD",
    "init_whitening",
    "make_airbench94",
]

# airbench94's hyp['net']: base_width 64; block widths 1x, 4x, 4x of it; 2x2 whitening; output scale 1/9.
AIRBENCH94_WIDTHS = (64, 256, 256)
_WHITEN_KERNEL = 2
_WHITEN_CHANNELS = 2 * 3 * _WHITEN_KERNEL**2  # 24: each eigenvector of the 12-dim patch space, and its negative
_SCALING_FACTOR = 1 / 9
_BN_MOMENTUM = 1 - 0.6  # airbench's batchnorm_momentum 0.6 is PyTorch's 1 - momentum
_BN_EPS = 1e-12


class _BatchNorm(nn.BatchNorm2d):
    """airbench's BatchNorm: tiny eps, heavy momentum, a scale that can be frozen at 1."""

    def __init__(self, num_features: int, *, frozen_scale: bool) -> None:
        super().__init__(num_features, eps=_BN_EPS, momentum=_BN_MOMENTUM)
        self.weight.requires_grad = not frozen_scale


class _Conv(nn.Conv2d):
    """conv3x3, "same" padding, no bias; its first ``c_in`` filters start as the identity (dirac)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(c_in, c_out, kernel_size=3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        w = self.weight.data
        torch.nn.init.dirac_(w[: w.size(1)])  # an implicit residual at initialization


class _ConvGroup(nn.Module):
    """conv -> pool 2 -> BN -> GELU -> conv -> BN -> GELU: (B, c_in, H, W) -> (B, c_out, H//2, W//2)."""

    def __init__(self, c_in: int, c_out: int, *, frozen_scale: bool) -> None:
        super().__init__()
        self.conv1 = _Conv(c_in, c_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _BatchNorm(c_out, frozen_scale=frozen_scale)
        self.conv2 = _Conv(c_out, c_out)
        self.norm2 = _BatchNorm(c_out, frozen_scale=frozen_scale)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class Airbench94(nn.Sequential):
    """airbench94's network (see the module docstring); build it with ``make_airbench94``.

    ``self[0]`` is the whitening conv; ``self.whiten`` names it too.
    """

    def __init__(self, widths: tuple[int, int, int], num_classes: int, frozen_bn_scales: bool) -> None:
        w1, w2, w3 = widths
        super().__init__(
            nn.Conv2d(3, _WHITEN_CHANNELS, kernel_size=_WHITEN_KERNEL, padding=0, bias=True),  # (B, 24, 31, 31)
            nn.GELU(),
            _ConvGroup(_WHITEN_CHANNELS, w1, frozen_scale=frozen_bn_scales),  # (B, w1, 15, 15)
            _ConvGroup(w1, w2, frozen_scale=frozen_bn_scales),  # (B, w2, 7, 7)
            _ConvGroup(w2, w3, frozen_scale=frozen_bn_scales),  # (B, w3, 3, 3)
            nn.MaxPool2d(3),  # (B, w3, 1, 1)
            nn.Flatten(),  # (B, w3)
            nn.Linear(w3, num_classes, bias=False),  # (B, num_classes)
        )
        self.widths = tuple(widths)

    @property
    def whiten(self) -> nn.Conv2d:
        return self[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * _SCALING_FACTOR  # airbench's Mul(1/9): smaller logits early on


def _scaled_widths(width: float) -> tuple[int, int, int]:
    if isinstance(width, bool) or not isinstance(width, (int, float)):
        raise TypeError(f"width must be a number (a multiplier of airbench94's widths 64-256-256), got {width!r}")
    check_positive(width, "width")
    return tuple(max(1, round(w * width)) for w in AIRBENCH94_WIDTHS)


def make_airbench94(
    width: float = 1.0,
    *,
    num_classes: int = 10,
    frozen_bn_scales: bool = True,
    frozen_whitening: bool = True,
) -> Airbench94:
    """Build airbench94's network with its block widths (64, 256, 256) multiplied by ``width``.

    Weights are drawn from torch's global RNG (seed first for comparable runs). The model is fp32 in
    the default memory format on the CPU: the caller moves it, and chooses channels_last and autocast.

    Args:
        width: multiplier of the block widths, e.g. 0.125 gives (8, 32, 32); the whitening conv keeps
            its 24 channels (they are set by its 2x2 kernel, not by the width).
        num_classes: outputs of the final linear layer.
        frozen_bn_scales: as airbench: the BatchNorm scales stay 1 (``requires_grad=False``); False
            trains them, as a standard BatchNorm does.
        frozen_whitening: as airbench: the whitening conv's weight does not train (set it with
            ``init_whitening``); False leaves it trainable from PyTorch's default initialization.

    Returns:
        An ``Airbench94`` (an ``nn.Sequential``).

    Raises:
        TypeError / ValueError: a width that is not a positive number, a bad ``num_classes`` or flag.
    """
    widths = _scaled_widths(width)
    check_positive(num_classes, "num_classes", allow_none=False, integer=True)
    check_flag(frozen_bn_scales, "frozen_bn_scales")
    check_flag(frozen_whitening, "frozen_whitening")
    net = Airbench94(widths, num_classes, frozen_bn_scales)
    net.whiten.weight.requires_grad = not frozen_whitening
    return net


@torch.no_grad()
def init_whitening(layer: nn.Conv2d, images: torch.Tensor, *, eps: float = 5e-4) -> None:
    """Set ``layer``'s weights to whiten the 2x2 patches of ``images`` (airbench's ``init_whitening_conv``).

    The patch covariance's eigenvectors, each divided by the square root of its eigenvalue plus
    ``eps``, and their negatives (so a following GELU sees both signs): the layer's outputs are
    decorrelated with unit variance on the training data.

    Args:
        layer: a Conv2d with ``2 * C * k * k`` output channels, C input channels and a k x k kernel.
        images: (N, C, H, W) normalized training images (a few thousand are plenty).
        eps: added to the eigenvalues, so near-constant directions are not blown up.

    Raises:
        ValueError: the layer's shape does not fit the images' channels.
    """
    if not isinstance(layer, nn.Conv2d) or not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise TypeError("init_whitening needs a Conv2d and a (N, C, H, W) tensor of images")
    c_out, c, h, w = layer.weight.shape
    if c != images.shape[1] or c_out != 2 * c * h * w:
        raise ValueError(f"a whitening conv for {images.shape[1]} channels needs {2 * images.shape[1] * h * w} outputs")
    patches = images.float().unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w)  # (P, C, h, w)
    flat = patches.reshape(patches.shape[0], -1)  # (P, C*h*w)
    covariance = flat.T @ flat / flat.shape[0]
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance, UPLO="U")
    eigenvalues = eigenvalues.flip(0).view(-1, 1, 1, 1)
    eigenvectors = eigenvectors.T.reshape(c * h * w, c, h, w).flip(0)
    scaled = eigenvectors / torch.sqrt(eigenvalues + eps)
    layer.weight.copy_(torch.cat((scaled, -scaled)).to(layer.weight.dtype))


# A training step's FLOPs per image, in forward passes: the backward computes about two products for each
# one of the forward (the gradient of the input and of the weights). airbench's README agrees: 0.36 PFLOPs
# for 9.9 epochs of 50,000 images is 3.1 times its network's 236 MFLOPs forward per image.
TRAINING_FLOPS_PER_FORWARD = 3


@dataclass(frozen=True)
class PublishedRecord:
    """A published time to 94% on CIFAR-10: cited, never measured here.

    ``flops_per_image`` is its network's forward FLOPs per 32x32 image, counted as ``count_flops`` counts
    (a multiply-add is 2 FLOPs); ``source`` says who published it, where and when.
    """

    name: str
    seconds: float  # wall time to 94%, as published
    gpu: str
    train_images: float | None = None  # images trained in that time (epochs x 50,000), where the source says
    flops_per_image: float | None = None
    source: str = ""
    network: str = "width 1"  # what it trained: airbench94's network at width 1, unless named

    @property
    def images_per_second(self) -> float | None:
        return None if self.train_images is None else self.train_images / self.seconds

    @property
    def training_flops_per_second(self) -> float | None:
        """Training FLOP/s: images/s times ``TRAINING_FLOPS_PER_FORWARD`` forward passes (None: not known)."""
        rate = self.images_per_second
        if rate is None or self.flops_per_image is None:
            return None
        return rate * TRAINING_FLOPS_PER_FORWARD * self.flops_per_image


# Published records (cited, never measured here), all on CIFAR-10 to 94% mean accuracy, evaluation included. airbench:
# Keller Jordan, github.com/KellerJordan/cifar10-airbench, README (2024-2025) and the scripts' headers; the paper is
# "94% on CIFAR-10 in 3.29 Seconds on a Single GPU" (2024, arXiv:2404.00498). The three scripts train the same network.
PUBLISHED_RECORDS = (
    PublishedRecord(
        "airbench94_muon", seconds=2.59, gpu="NVIDIA A100 (400 W)", train_images=8 * 50_000,
        source="airbench README and airbench94_muon.py (November 2024 on): 2.59 s, 8 epochs, Muon optimizer, torch 2.4.1",
    ),
    PublishedRecord(
        "airbench94_compiled", seconds=3.09, gpu="NVIDIA A100", train_images=9.9 * 50_000,
        source="airbench README (August 2024 on; 3.29 s in the paper, March 2024), now legacy/: 9.9 epochs, torch.compile",
    ),
    PublishedRecord(
        "airbench94", seconds=3.83, gpu="NVIDIA A100", train_images=9.9 * 50_000,
        source="the paper and the airbench README (March 2024 on), now legacy/airbench94.py: 9.9 epochs, eager",
    ),
    # Myrtle.ai, David Page: DAWNBench, 94% in 26 s on one V100 with a ResNet-9 (its images and FLOPs not given there).
    PublishedRecord(
        "Myrtle.ai", seconds=26.0, gpu="NVIDIA V100", network="ResNet-9",
        source='David Page, "How to Train Your ResNet", Myrtle.ai blog series (2018-2019)',
    ),
)  # fmt: skip


def _flops_rate(flops_per_second: float | None) -> str:
    if flops_per_second is None:
        return "-"
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:,.1f} TFLOP/s"
    return f"{flops_per_second / 1e9:,.1f} GFLOP/s"


@dataclass(frozen=True)
class RecordComparison:
    """This run next to published records: its time to target only where the task is theirs (CIFAR-10, width
    1, a 94% target); its training throughput always, compared per FLOP, since a narrower network trains more
    images per second for the same arithmetic rate (images/s times the forward FLOPs per image times
    ``TRAINING_FLOPS_PER_FORWARD``)."""

    device: str  # this run's device, in words
    data: str
    width: float
    target: float
    seconds: float | None  # this run's mean time to target (None: a seed missed it)
    images_per_second: float  # this run's training throughput
    flops_per_image: float  # this run's forward FLOPs per image (``count_flops`` on its network)
    records: tuple[PublishedRecord, ...] = PUBLISHED_RECORDS
    run: str = "this run"  # how the table names this run (e.g. which rung)
    # airbench94's forward FLOPs per image at width 1 (``count_flops``), given to each record of that network that
    # lacks it (the published records do: their sources give no per-image count)
    airbench94_flops_per_image: float | None = None

    def __post_init__(self) -> None:
        check_positive(self.images_per_second, "images_per_second", allow_none=False)
        check_positive(self.flops_per_image, "flops_per_image", allow_none=False)
        if self.airbench94_flops_per_image is not None:
            check_positive(self.airbench94_flops_per_image, "airbench94_flops_per_image", allow_none=False)
            counted = tuple(
                dataclasses.replace(r, flops_per_image=self.airbench94_flops_per_image)
                if r.network == "width 1" and r.flops_per_image is None else r
                for r in self.records
            )  # fmt: skip
            object.__setattr__(self, "records", counted)  # frozen: set once, while it is being built

    @property
    def same_task(self) -> bool:
        """True when this run trained what the records did: CIFAR-10 at width 1 to at least 94%."""
        return self.data == "CIFAR-10" and self.width == 1.0 and self.target >= 0.94

    @property
    def training_flops_per_second(self) -> float:
        return self.images_per_second * TRAINING_FLOPS_PER_FORWARD * self.flops_per_image

    def per_flop(self, record: PublishedRecord) -> float | None:
        """The record's training FLOP/s over this run's (None: the record's is not known)."""
        theirs = record.training_flops_per_second
        return None if theirs is None else theirs / self.training_flops_per_second

    def rows(self) -> list[list[str]]:
        mine = "-" if self.seconds is None or not self.same_task else f"{format_seconds(self.seconds)}"
        rows = [[self.run, self.device, f"{self.data}, width {self.width:g}", f"{self.target:.0%}", mine,
                 f"{self.images_per_second:,.0f}", f"{self.flops_per_image / 1e6:,.1f}",
                 _flops_rate(self.training_flops_per_second), "1x"]]  # fmt: skip
        for r in self.records:
            rate, ratio = r.images_per_second, self.per_flop(r)
            rows.append([f"{r.name} (published)", r.gpu, f"CIFAR-10, {r.network}", "94%", format_seconds(r.seconds),
                         "-" if rate is None else f"{rate:,.0f}",
                         "-" if r.flops_per_image is None else f"{r.flops_per_image / 1e6:,.1f}",
                         _flops_rate(r.training_flops_per_second), "-" if ratio is None else f"{ratio:,.0f}x"])  # fmt: skip
        return rows

    def _repr_markdown_(self) -> str:
        header = ["run", "device", "data", "target", "time to target", "train images/s", "forward MFLOPs per image",
                  f"training FLOP/s ({TRAINING_FLOPS_PER_FORWARD}x forward)", "FLOP/s vs this run"]  # fmt: skip
        note = "" if self.same_task else (
            "\n\nDifferent data, width or target: no time to target compares, only the arithmetic rate, and it is "
            "not a record."
        )  # fmt: skip
        sources = "".join(f"\n- {r.name}: {r.source}" for r in self.records if r.source)
        return markdown_table(header, self.rows()) + note + (f"\n\nSources:{sources}" if sources else "")

    def __repr__(self) -> str:
        return self._repr_markdown_()
