"""The ladder's configuration and per-run results: ``LadderConfig`` (one training run: the recipe and
the tricks switched on), ``TargetTrace`` and ``TrainingRun`` (what one seed of one rung measured).

Their own module so that ``run`` (which trains) and ``results`` (which reads the runs)
both import them, and neither imports the other's back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tricks_lib._validate import check_positive

__all__ = ["LadderConfig", "TargetTrace", "TrainingRun"]

_OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
# airbench94's SGD in mean-loss form: lr 11.5 per 1024 examples with a summed loss and Nesterov momentum
# 0.85 is 11.5 / (1024 * (1 + 1 / (1 - 0.85))) per example; its weight decay 0.0153 per 1024 examples,
# decoupled from the LR, is 0.0153 / 11.5 as torch's coefficient on the mean loss.
_LR_PER_EXAMPLE = 11.5 / (1024 * (1 + 1 / (1 - 0.85)))
_WEIGHT_DECAY = 0.0153 / 11.5


# --------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class LadderConfig:
    """One training run: the recipe (first block) and the tricks the ladder switches on (second block).

    Defaults are the ladder's baseline: fp32, eager, a host input pipeline, batch 64, a for-loop
    optimizer, no warm-up, and none of airbench's own tricks.
    """

    width: float = 0.25  # multiplier of airbench94's widths (64, 256, 256)
    epochs: int = 8  # the fixed schedule's length; a run stops earlier at the target
    target: float = 0.9  # test accuracy that stops the run
    translate: int = 2  # augmentation: random flip and translation by up to this many pixels
    lr_per_example: float = _LR_PER_EXAMPLE  # SGD's LR is this times the base batch size ...
    base_batch_size: int = 64  # ... and scales linearly with batch_size / base_batch_size
    momentum: float = 0.85  # Nesterov momentum (airbench94)
    weight_decay: float = _WEIGHT_DECAY
    bias_scaler: float = 64.0  # BatchNorm biases train at this times the LR (airbench94)
    eval_batch_size: int = 1000

    on_device_data: bool = False  # the whole dataset as one device tensor, batched augmentation
    channels_last: bool = False
    autocast_dtype: torch.dtype | None = None  # torch.bfloat16 / torch.float16 (with GradScaler)
    batch_size: int = 64
    warmup_fraction: float = 0.0  # LR warm-up over this share of the steps (airbench: 0.23)
    optimizer_impl: str = "for-loop"  # "for-loop", "foreach" or "fused" SGD
    compile: bool = False  # torch.compile the training forward (inductor)
    label_smoothing: float = 0.0
    lookahead: bool = False  # airbench's lookahead EMA, from 30% of the steps, every 5 steps
    flip_tta: bool = False  # evaluate on the image and its mirror, averaging the logits
    whitening: bool = False  # whitening init (frozen) of the first conv, frozen BN scales

    def __post_init__(self) -> None:
        check_positive(self.width, "width")
        for name in ("epochs", "base_batch_size", "batch_size", "eval_batch_size"):
            check_positive(getattr(self, name), name, allow_none=False, integer=True)
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be an accuracy in (0, 1], got {self.target!r}")
        if self.optimizer_impl not in _OPTIMIZER_IMPLS:
            raise ValueError(f"optimizer_impl must be one of {_OPTIMIZER_IMPLS}, got {self.optimizer_impl!r}")
        if self.autocast_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"autocast_dtype must be torch.float16, torch.bfloat16 or None, got {self.autocast_dtype}")
        if not 0 <= self.warmup_fraction < 1 or not 0 <= self.label_smoothing < 1:
            raise ValueError("warmup_fraction and label_smoothing must be in [0, 1)")

    @property
    def lr(self) -> float:
        """SGD's LR at the schedule's peak: the linear scaling rule from ``base_batch_size``."""
        return self.lr_per_example * self.base_batch_size * self.batch_size / self.base_batch_size


@dataclass(frozen=True)
class TargetTrace:
    """Seconds and accuracy after each epoch of one run, and when it first reached the target."""

    accuracies: tuple[float, ...]
    elapsed: tuple[float, ...]  # seconds since the start (setup included) at the end of each evaluation
    train_seconds: tuple[float, ...]  # seconds of each epoch's training (evaluations excluded)
    target: float

    @property
    def epochs_to_target(self) -> int | None:
        """Epochs until the first evaluation at or above the target, None if none reached it."""
        return next((i + 1 for i, a in enumerate(self.accuracies) if a >= self.target), None)

    @property
    def time_to_target(self) -> float | None:
        reached = self.epochs_to_target
        return None if reached is None else self.elapsed[reached - 1]


@dataclass(frozen=True)
class TrainingRun:
    """One seed of one rung: time to target (None: not reached), the accuracies, throughput and memory."""

    seed: int
    trace: TargetTrace
    images_per_second: float  # training images per second of training, compile excluded
    compile_seconds: float | None  # first step minus a typical step, when compiled
    setup_seconds: float  # data to the device, whitening init
    peak_memory_bytes: int | None  # CUDA: allocator peak of the run; CPU: None (see saved_bytes)
    saved_bytes: int  # what autograd saved for backward in one training step (exact on every device)

    @property
    def time_to_target(self) -> float | None:
        return self.trace.time_to_target

    @property
    def final_accuracy(self) -> float:
        """Accuracy at the last evaluation: the one that reached the target, or the schedule's end."""
        return self.trace.accuracies[-1]
