"""A training step whose speed tricks are parameters, and learning-rate schedules with linear warmup.

* ``TrainStep``: forward, backward and optimizer step for one batch, with autocast (fp16/bf16),
  channels_last, gradient accumulation over micro-batches (``no_sync`` under DDP, switchable), ``set_to_none``
  and ``torch.compile`` as switches. Build it with ``make_train_step``.
* ``warmup_factor`` / ``linear_warmup``: linear warmup then constant or cosine decay, as a pure
  function and as a ``LambdaLR``.
* ``linear_scaled_lr``: the linear LR-scaling rule of Goyal et al. 2017.
* ``evaluate_accuracy``: accuracy under ``torch.inference_mode`` and ``model.eval()``.

The step returns its loss as a tensor on the device and never calls ``.item()``: reading a value
back is a host-device sync, so the caller decides when to pay for it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "autocast_dtype",
    "TrainStepConfig",
    "TrainStep",
    "make_train_step",
    "warmup_factor",
    "linear_warmup",
    "linear_scaled_lr",
    "evaluate_accuracy",
]

_AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class TrainStepConfig:
    """The switches of a ``TrainStep``.

    Attributes:
        autocast_dtype: ``torch.float16``, ``torch.bfloat16`` or None (full fp32).
        channels_last: model and 4-D inputs in NHWC memory format.
        accumulation_steps: micro-batches per optimizer step (the batch is split into this many).
        set_to_none: ``optimizer.zero_grad(set_to_none=...)``.
        compile: run the forward pass through ``torch.compile``.
        compile_backend: the ``torch.compile`` backend ("inductor" generates fused kernels;
            "eager" only traces, which is fast and useful in tests).
        grad_scaling: whether a ``GradScaler`` is active (fp16 autocast only).
        no_sync: under DistributedDataParallel, run all but the last micro-batch inside
            ``model.no_sync()`` (one gradient all-reduce per optimizer step). False all-reduces
            after every micro-batch: the same gradients, more communication (a baseline).
    """

    autocast_dtype: torch.dtype | None = None
    channels_last: bool = False
    accumulation_steps: int = 1
    set_to_none: bool = True
    compile: bool = False
    compile_backend: str = "inductor"
    grad_scaling: bool = False
    no_sync: bool = True

    def __repr__(self) -> str:
        dtype = "fp32" if self.autocast_dtype is None else str(self.autocast_dtype).replace("torch.", "")
        parts = [dtype]
        if self.channels_last:
            parts.append("channels_last")
        if self.accumulation_steps > 1:
            parts.append(f"accumulate={self.accumulation_steps}")
        parts.append(f"set_to_none={self.set_to_none}")
        if self.compile:
            parts.append(f"compile={self.compile_backend}")
        if self.grad_scaling:
            parts.append("GradScaler")
        if not self.no_sync:
            parts.append("no_sync=False")
        return f"TrainStepConfig({', '.join(parts)})"


class TrainStep:
    """One optimizer step on one batch: ``loss = step(inputs, targets)``.

    Call ``make_train_step`` to build one. ``step.backward(inputs, targets)`` runs only the
    forward/backward passes over the micro-batches and leaves the gradients in ``.grad`` (useful to
    inspect or compare gradients); ``step(inputs, targets)`` also steps the optimizer (through the
    GradScaler under fp16) and zeroes the gradients.

    The loss function must average over the batch (``reduction="mean"``); each micro-batch loss is
    weighted by its share of the batch, so the accumulated gradient is the gradient of the full
    batch's mean loss whatever the split. Gradients are expected to be zero or None on entry (as
    the previous step leaves them).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        config: TrainStepConfig,
        device: torch.device,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.config = config
        self.device = device
        self._forward: Callable[[torch.Tensor], torch.Tensor] = model
        if config.compile:
            self._forward = torch.compile(model, backend=config.compile_backend)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.grad_scaling)

    def __repr__(self) -> str:
        return f"TrainStep({type(self.model).__name__}, {type(self.optimizer).__name__}, {self.config!r})"

    def _autocast(self):
        if self.config.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.config.autocast_dtype)

    def _micro_batches(self, inputs: torch.Tensor, targets: torch.Tensor):
        k = self.config.accumulation_steps
        if inputs.shape[0] < k:
            raise ValueError(
                f"batch of {inputs.shape[0]} cannot be split into {k} micro-batches; lower accumulation_steps"
            )
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs ({inputs.shape[0]}) and targets ({targets.shape[0]}) differ in batch size")
        return list(zip(torch.tensor_split(inputs, k), torch.tensor_split(targets, k)))

    def backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward over ``accumulation_steps`` micro-batches; gradients accumulate.

        Under DistributedDataParallel the gradient all-reduce runs only on the last micro-batch
        (the others run inside ``model.no_sync()``), unless the step was built with ``no_sync=False``.

        Returns:
            The batch's mean loss, detached, on the device (no host sync).
        """
        cfg = self.config
        batch = inputs.shape[0]
        total = torch.zeros((), device=self.device)
        micro = self._micro_batches(inputs, targets)
        skip_sync = cfg.no_sync and isinstance(self.model, nn.parallel.DistributedDataParallel)
        for i, (x, y) in enumerate(micro):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            if cfg.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            last = i == len(micro) - 1
            sync = self.model.no_sync() if (skip_sync and not last) else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    out = self._forward(x)
                    # weight by the micro-batch's share, so the sum of weighted means is the batch mean
                    loss = self.loss_fn(out, y) * (x.shape[0] / batch)
                self.scaler.scale(loss).backward()
            total += loss.detach().float()
        return total

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One full optimizer step on the batch. Returns the detached mean loss on the device."""
        loss = self.backward(inputs, targets)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.config.set_to_none)
        return loss


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    *,
    device: torch.device | str | None = None,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    accumulation_steps: int = 1,
    set_to_none: bool = True,
    compile: bool = False,
    compile_backend: str = "inductor",
    grad_scaling: bool | None = None,
    no_sync: bool = True,
) -> TrainStep:
    """Build a ``TrainStep`` with the given tricks switched on.

    Args:
        model: the module to train, already on ``device``. With ``channels_last`` it is converted
            in place (``model.to(memory_format=torch.channels_last)``); convert a model before
            wrapping it in DistributedDataParallel, whose gradient buckets follow the layout.
        optimizer: an optimizer over ``model``'s parameters.
        loss_fn: ``loss_fn(outputs, targets)`` with mean reduction; default cross-entropy.
        device: where inputs are moved; default the device of the model's first parameter.
        autocast_dtype: ``torch.float16`` or ``torch.bfloat16`` to run the forward under
            ``torch.autocast``; None for fp32.
        channels_last: NHWC memory format for the model and 4-D inputs.
        accumulation_steps: split each batch into this many micro-batches, one optimizer step.
        set_to_none: free gradients (``None``) instead of writing zeros after each step.
        compile: wrap the forward in ``torch.compile`` (compiles on the first call).
        compile_backend: backend passed to ``torch.compile``.
        grad_scaling: use a ``GradScaler``; default True exactly when ``autocast_dtype`` is fp16
            (bf16 has fp32's exponent range and needs no loss scaling).
        no_sync: with a DistributedDataParallel model and ``accumulation_steps > 1``, skip the
            gradient all-reduce of all but the last micro-batch (``model.no_sync()``). False
            all-reduces every micro-batch: identical gradients, ``accumulation_steps`` times the
            all-reduces (the baseline that shows what ``no_sync`` saves). Ignored without DDP.

    Returns:
        A ``TrainStep``.

    Raises:
        TypeError: for a model/optimizer of the wrong type, or a ``no_sync`` that is not a bool.
        ValueError: for an unsupported autocast dtype or ``accumulation_steps < 1``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if autocast_dtype is not None and autocast_dtype not in _AUTOCAST_DTYPES:
        raise ValueError(f"autocast_dtype must be torch.float16, torch.bfloat16 or None, got {autocast_dtype}")
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
    if not isinstance(no_sync, bool):
        raise TypeError(f"no_sync must be True or False, got {type(no_sync).__name__}")
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if grad_scaling is None:
        grad_scaling = autocast_dtype == torch.float16
    if channels_last:
        model.to(memory_format=torch.channels_last)
    config = TrainStepConfig(
        autocast_dtype=autocast_dtype,
        channels_last=bool(channels_last),
        accumulation_steps=accumulation_steps,
        set_to_none=bool(set_to_none),
        compile=bool(compile),
        compile_backend=compile_backend,
        grad_scaling=bool(grad_scaling),
        no_sync=no_sync,
    )
    return TrainStep(model, optimizer, loss_fn or nn.functional.cross_entropy, config, device)


def warmup_factor(
    step: int,
    *,
    warmup_steps: int,
    start_factor: float = 0.1,
    total_steps: int | None = None,
    decay: str = "constant",
    min_factor: float = 0.0,
) -> float:
    """LR multiplier at optimizer step ``step`` (0-based): linear warmup, then constant or cosine.

    During warmup (``step < warmup_steps``) the factor is
    ``start_factor + (1 - start_factor) * step / warmup_steps``: exactly ``start_factor`` at step 0,
    rising by equal increments, and 1 at ``warmup_steps``. Afterwards it is 1 (``decay="constant"``)
    or follows a half cosine from 1 at ``warmup_steps`` to ``min_factor`` at ``total_steps``
    (``decay="cosine"``) and stays there.

    Goyal et al. 2017 warm up from the small-batch LR to k times it: ``start_factor = 1 / k``.

    Raises:
        ValueError: for negative steps, ``start_factor`` outside [0, 1], an unknown ``decay``, or
            cosine decay without ``total_steps > warmup_steps``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= start_factor <= 1.0:
        raise ValueError(f"start_factor must be in [0, 1], got {start_factor}")
    if decay not in ("constant", "cosine"):
        raise ValueError(f"decay must be 'constant' or 'cosine', got {decay!r}")
    if decay == "cosine" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError("cosine decay needs total_steps > warmup_steps")
    if step < warmup_steps:
        return start_factor + (1.0 - start_factor) * step / warmup_steps
    if decay == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def linear_warmup(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    start_factor: float = 0.1,
    total_steps: int | None = None,
    decay: str = "constant",
    min_factor: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying ``warmup_factor`` to each group's base LR; call ``.step()`` after each optimizer step.

    Arguments as in ``warmup_factor`` (validated here, once).

    Raises:
        TypeError: if ``optimizer`` is not an optimizer. ValueError: as ``warmup_factor``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    kwargs = dict(
        warmup_steps=warmup_steps,
        start_factor=start_factor,
        total_steps=total_steps,
        decay=decay,
        min_factor=min_factor,
    )
    warmup_factor(0, **kwargs)  # validate now rather than at the first scheduler step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_factor(step, **kwargs))


def linear_scaled_lr(base_lr: float, batch_size: int, base_batch_size: int) -> float:
    """The linear scaling rule (Goyal et al. 2017): multiply the LR by ``batch_size / base_batch_size``.

    Raises:
        ValueError: for non-positive arguments.
    """
    if base_lr <= 0 or batch_size <= 0 or base_batch_size <= 0:
        raise ValueError("base_lr, batch_size and base_batch_size must all be > 0")
    return base_lr * batch_size / base_batch_size


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
