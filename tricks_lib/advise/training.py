"""``try_training_tricks``: every applicable training trick tried on the reader's own model, checked, then timed.

The baseline is the plain loop most code writes: fp32, NCHW, eager, the optimizer as the reader built it,
``optimizer.zero_grad()``. Each trick is one switch on that loop (``TrainingSwitches``); its step is built
from a fresh model with the same weights, checked against the baseline's step (``checks``), and every
trick that passed is timed in one interleaved comparison against the baseline (``compare``: shuffled
rounds, the paired interval, the outcome). The recommended tricks are then stacked and measured together.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from tricks_lib._validate import check_flag, check_positive
from tricks_lib.advise.checks import StepResult, check_step
from tricks_lib.advise.compile_first import LossOf, first_call_note, fresh_process_compile_cost, with_break_even
from tricks_lib.advise.inputs import (
    batch_on,
    bf16_reason,
    channels_last_reason,
    check_budget,
    check_factory,
    check_same_weights,
    check_tolerances,
    check_tricks,
)
from tricks_lib.advise.report import AdviceReport, TrickRow
from tricks_lib.advise.timing import (
    CALLS_PER_VARIANT,
    TIMED_ROUNDS,
    raised_row,
    spent_row,
    time_passing,
    time_stacked,
)
from tricks_lib.comparing import Budget, compare
from tricks_lib.compiling import fresh_compile_cache
from tricks_lib.env import describe, pick_device
from tricks_lib.measurements import Comparison
from tricks_lib.timing import time_first_call

__all__ = ["TRAINING_TRICKS", "TrainingSwitches", "try_training_tricks"]

TRAINING_TRICKS = (
    "channels_last",
    "bf16 autocast",
    "fp16 autocast + GradScaler",
    "TF32 matmuls",
    "foreach optimizer",
    "fused optimizer",
    "zero_grad(set_to_none=True)",
    "cudnn.benchmark",
    "torch.compile",
)
LOSSY = {"bf16 autocast", "fp16 autocast + GradScaler", "TF32 matmuls"}

LINES = {
    "channels_last": "model = model.to(memory_format=torch.channels_last)\n"
    "x = x.contiguous(memory_format=torch.channels_last)",
    "bf16 autocast": "with torch.autocast(device.type, dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)",
    "fp16 autocast + GradScaler": "scaler = torch.amp.GradScaler(device.type)\n"
    "with torch.autocast(device.type, dtype=torch.float16):\n    loss = loss_fn(model(x), y)\n"
    "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()",
    "TF32 matmuls": 'torch.backends.cuda.matmul.fp32_precision = "tf32"  # older torch: .allow_tf32 = True',
    "foreach optimizer": "optimizer = torch.optim.SGD(model.parameters(), ..., foreach=True)  # your optimizer's class",
    "fused optimizer": "optimizer = torch.optim.SGD(model.parameters(), ..., fused=True)  # your optimizer's class",
    "torch.compile": "model = torch.compile(model)",
}


@dataclass(frozen=True)
class TrainingSwitches:
    """The baseline loop's switches; each trick turns one on, the stacked row all the recommended ones."""

    channels_last: bool = False
    autocast: torch.dtype | None = None
    tf32: bool = False
    optimizer_impl: str | None = None  # "foreach" or "fused"
    compile: bool = False


SWITCH_OF = {
    "channels_last": TrainingSwitches(channels_last=True),
    "bf16 autocast": TrainingSwitches(autocast=torch.bfloat16),
    "fp16 autocast + GradScaler": TrainingSwitches(autocast=torch.float16),
    "TF32 matmuls": TrainingSwitches(tf32=True),
    "foreach optimizer": TrainingSwitches(optimizer_impl="foreach"),
    "fused optimizer": TrainingSwitches(optimizer_impl="fused"),
    "torch.compile": TrainingSwitches(compile=True),
}


def _combine(switches: Sequence[TrainingSwitches]) -> TrainingSwitches:
    out = TrainingSwitches()
    for s in switches:
        out = replace(
            out,
            channels_last=out.channels_last or s.channels_last,
            autocast=s.autocast or out.autocast,
            tf32=out.tf32 or s.tf32,
            optimizer_impl=s.optimizer_impl or out.optimizer_impl,
            compile=out.compile or s.compile,
        )
    return out


def _rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer class and settings, with ``impl`` ("foreach" or "fused") switched on."""
    if impl not in optimizer.defaults:
        raise ValueError(f"{type(optimizer).__name__} has no {impl}= option")
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    groups = [{**g, **flags} for g in optimizer.param_groups]
    return type(optimizer)(groups, **flags)  # also as keywords: the constructor checks them (fused's device rules)


@contextlib.contextmanager
def _tf32(on: bool):
    """CUDA matmuls and cuDNN convolutions in TF32 (``on``) or in full fp32, for the block; restored after.

    torch >= 2.9 has ``fp32_precision`` (and refuses a read of the legacy ``allow_tf32`` once it was set);
    older torch only ``allow_tf32``.
    """
    new_api = hasattr(torch.backends.cuda.matmul, "fp32_precision")
    if new_api:
        knobs = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [k.fp32_precision for k in knobs]
        for k in knobs:
            k.fp32_precision = "tf32" if on else "ieee"
    else:
        saved = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        if new_api:
            for k, value in zip(knobs, saved):
                k.fp32_precision = value
        else:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _Loop:
    """One variant of the reader's training loop: a fresh model, its optimizer, and ``step()``."""

    def __init__(self, make_model, make_optimizer, loss_fn, inputs, targets, device, switches: TrainingSwitches):
        model = make_model().to(device).train()
        if switches.channels_last:
            model = model.to(memory_format=torch.channels_last)
            inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
        self.model, self.inputs, self.targets, self.device = model, inputs, targets, device
        optimizer = make_optimizer(model.parameters())
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"make_optimizer must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = (
            _rebuild_optimizer(optimizer, switches.optimizer_impl) if switches.optimizer_impl else optimizer
        )
        self.forward = torch.compile(model) if switches.compile else model
        self.switches, self.loss_fn = switches, loss_fn
        self.scaler = torch.amp.GradScaler(device.type, enabled=switches.autocast == torch.float16)

    def _precision(self, checking: bool):
        """TF32 for the TF32 trick; on CUDA, full fp32 for the other checked steps (cuDNN defaults to TF32
        convolutions, whose rounding would swamp the lossless tricks' bound)."""
        if self.switches.tf32:
            return _tf32(True)
        if checking and self.device.type == "cuda":
            return _tf32(False)
        return contextlib.nullcontext()

    def _loss(self) -> torch.Tensor:
        s = self.switches
        with torch.autocast(self.device.type, dtype=s.autocast or torch.bfloat16, enabled=s.autocast is not None):
            loss = self.loss_fn(self.forward(*self.inputs), self.targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(
                f"loss_fn must return a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}"
            )
        return loss

    def step(self) -> torch.Tensor:
        with self._precision(checking=False):
            loss = self._loss()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
        return loss.detach()

    def checked_step(self) -> StepResult:
        """One step that also returns the loss, the unscaled gradients and the update, for the check.

        The random numbers are the same for every variant (dropout masks): drawn after one fixed seed, in a
        forked RNG state. An fp16 step whose scaled gradients overflowed is skipped by GradScaler, which
        then lowers its scale: that step is retried (up to 8 times) so the check compares a step that ran.
        """
        for _ in range(8):
            before = [p.detach().float().cpu().clone() for p in self.model.parameters()]
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(0)
                with self._precision(checking=True):
                    loss = self._loss()
                    self.scaler.scale(loss).backward()
                    self.scaler.unscale_(self.optimizer)
                    grads = tuple(
                        p.grad.detach().float().cpu().clone() for p in self.model.parameters() if p.grad is not None
                    )
                    scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.optimizer.zero_grad()
            if scale is None or self.scaler.get_scale() >= scale:  # not skipped (a skipped step lowers the scale)
                break
        update = tuple(p.detach().float().cpu() - b for p, b in zip(self.model.parameters(), before))
        return StepResult(loss=loss.detach().float().cpu(), grads=grads, update=update)


def _not_applicable(name: str, model: nn.Module, inputs, optimizer, device: torch.device, env) -> str | None:
    """Why ``name`` does not apply to this model on this device, or None if it does."""
    cuda = device.type == "cuda"
    capability = torch.cuda.get_device_capability(device) if cuda else None
    if name == "channels_last":
        return channels_last_reason(model, inputs)
    elif name == "bf16 autocast":
        return bf16_reason(device, env.cpu_bf16_native, "fp16 with GradScaler is its 16-bit type")
    elif name == "fp16 autocast + GradScaler":
        if not cuda:
            return "needs a CUDA GPU (CPU fp16 convolutions and matmuls have no fast kernels)"
    elif name == "TF32 matmuls":
        if not cuda or capability < (8, 0):
            return "needs an Ampere or newer CUDA GPU (sm80+)"
    elif name in ("foreach optimizer", "fused optimizer"):
        impl = name.split()[0]
        if impl not in optimizer.defaults:
            return f"{type(optimizer).__name__} has no {impl}= option"
        if optimizer.defaults.get(impl):
            return f"the optimizer already uses {impl}=True"
        if (
            impl == "foreach"
            and cuda
            and optimizer.defaults.get("foreach") is None
            and not optimizer.defaults.get("fused")
        ):
            return "the default on CUDA already: foreach=None uses the foreach kernels for CUDA tensors"
    elif name == "zero_grad(set_to_none=True)":
        return "the default since torch 2.0: the baseline's optimizer.zero_grad() already sets gradients to None"
    elif name == "cudnn.benchmark":
        if not cuda:
            return "no cuDNN on a CPU: convolutions run through oneDNN, which never reads the flag"
        return (
            "not measurable in this process: cuDNN keeps the plans it picked first and looks them up before it "
            "reads the flag; notebook 02, section 3, times it in fresh processes"
        )
    return None


def try_training_tricks(
    make_model: Callable[[], nn.Module],
    make_batch: Callable[[], object],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    make_optimizer: Callable | None = None,
    device: str | torch.device | None = None,
    tricks: Sequence[str] | None = None,
    budget_s: float = 120.0,
    exact_tolerance: float = 1e-2,
    lossy_tolerance: float = 0.1,
    memory_budget_bytes: int | None = None,
    batch_sizes: Sequence[int] | None = None,
    progress: bool = True,
) -> AdviceReport:
    """Try every applicable training trick on ``make_model``'s training step: check each, time those that pass.

    Args:
        make_model: returns a fresh model with the same weights on every call (seed inside it).
        make_batch: returns ``(inputs, targets)``; inputs a tensor or a tuple of tensors (moved to the device).
        loss_fn: ``loss_fn(model(*inputs), targets)`` -> a scalar tensor.
        make_optimizer: ``make_optimizer(parameters)`` -> an optimizer (default SGD, lr 0.01, momentum 0.9).
        device: where to train (default ``pick_device()``).
        tricks: names from ``TRAINING_TRICKS`` to consider (default all; each one that cannot apply here is a
            row that says why).
        budget_s: seconds the whole report may take; the timing and the stacked run share what the builds
            and checks leave (a compile's first call counts against it). Tricks that no longer fit are rows
            that say so.
        exact_tolerance: relative error of loss, gradients and update allowed to a lossless trick (reordered
            float arithmetic: through BatchNorm's backward it reaches about 1e-2 of the gradient's norm, e.g.
            8.4e-3 for channels_last and 4.8e-3 for torch.compile on a ResNet-18 at 128 px, batch 16, on a CPU).
        lossy_tolerance: the same for 16-bit autocast and TF32, whose error is the trick's price.
        memory_budget_bytes: also recommend a trick that passed its check, saves memory for backward against the
            baseline and stays within this many bytes, whatever its speed.
        batch_sizes: also time the baseline step at each of these batch sizes, by throughput (samples per
            second); ``make_batch`` must then take ``batch_size=`` (``report.batch_sizes``).
        progress: progress bars over the long steps (compiles, timing); the main command switches them off.

    ``torch.compile``'s first step is timed as a reader pays it: in fresh processes, with empty caches and with a
    warm on-disk cache (``compile_cost``, on the model and loss exported together with ``torch.export``), and
    the row says after how many steps it pays back. A model ``torch.export`` cannot export is timed in this
    process from empty caches, and the row says so.

    Returns:
        An ``AdviceReport``: ``rows``, ``recommended``, ``stacked``, ``code()``; shown as a table in Jupyter.

    Raises:
        TypeError / ValueError: a factory that is not callable, a model whose weights differ between calls,
            a batch that is not tensors, a loss that is not a scalar, an unknown trick, a budget that is not
            positive (each names the argument).
    """
    start = time.perf_counter()
    check_factory(make_model, "make_model", "lambda: torchvision.models.resnet18(num_classes=10)")
    check_factory(make_batch, "make_batch", "lambda: (torch.randn(32, 3, 224, 224), torch.randint(0, 10, (32,)))")
    check_factory(loss_fn, "loss_fn", "torch.nn.functional.cross_entropy", takes="(outputs, targets)")
    if make_optimizer is None:
        make_optimizer = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)  # noqa: E731
    check_factory(
        make_optimizer, "make_optimizer", "lambda params: torch.optim.SGD(params, lr=0.1)", takes="(parameters)"
    )
    budget_s = check_budget(budget_s)
    check_tolerances(exact_tolerance, lossy_tolerance)
    if memory_budget_bytes is not None:
        check_positive(memory_budget_bytes, "memory_budget_bytes", integer=True)
    check_flag(progress, "progress")
    if batch_sizes is not None:
        if isinstance(batch_sizes, (str, bytes)) or not batch_sizes:
            raise TypeError(f"batch_sizes must be a list of batch sizes such as [8, 32, 128], got {batch_sizes!r}")
        for b in batch_sizes:
            check_positive(b, "each of batch_sizes", allow_none=False, integer=True)
    chosen = check_tricks(tricks, TRAINING_TRICKS)
    dev = pick_device(device) if device is not None else pick_device()
    check_same_weights(make_model)
    inputs, targets = batch_on(make_batch(), dev)
    items = int(inputs[0].shape[0]) if inputs[0].dim() else 1

    def loop(switches: TrainingSwitches) -> _Loop:
        return _Loop(make_model, make_optimizer, loss_fn, inputs, targets, dev, switches)

    base = loop(TrainingSwitches())
    reference = base.checked_step()
    step_seconds = time_first_call(base.step, device=dev)  # a second step: what the timing will cost per call
    env = describe()
    rows: dict[str, TrickRow] = {}
    steps: dict[str, Callable[[], object]] = {"baseline": base.step}
    compile_cost_found, compile_first, compile_why = None, None, ""  # torch.compile's first step, when it ran
    for name in chosen:
        reason = _not_applicable(name, base.model, inputs, base.optimizer, dev, env)
        if reason is not None:
            rows[name] = TrickRow(name, applies=False, reason=reason)
            continue
        if time.perf_counter() - start > 0.5 * budget_s:
            rows[name] = spent_row(name)
            continue
        try:
            cache = contextlib.nullcontext()
            if name == "torch.compile":
                compile_cost_found, compile_why = fresh_process_compile_cost(
                    LossOf(make_model().to(dev).train(), loss_fn),
                    (*inputs, targets),
                    "compiled(*inputs).backward()",
                    dev,
                    progress,
                )
                if compile_cost_found is None:  # measured here instead: from empty caches, as a first run pays it
                    cache = fresh_compile_cache()
            variant = loop(SWITCH_OF[name])
            box: list[StepResult] = []
            with cache:
                first = time_first_call(lambda v=variant, b=box: b.append(v.checked_step()), device=dev)
            result = check_step(box[0], reference, lossy_tolerance if name in LOSSY else exact_tolerance)
        except Exception as err:  # a trick that cannot run on this model is a row, never the report's end
            rows[name] = raised_row(name, err)
            continue
        note = ""
        if name == "torch.compile":
            compile_first = first
            note = first_call_note(compile_cost_found, first, "step", compile_why)
        errors = (("loss", result.loss_error), ("gradients", result.grad_error), ("update", result.update_error))
        rows[name] = TrickRow(
            name,
            applies=True,
            check=result.text(),
            check_passed=result.passed,
            lines=LINES.get(name, ""),
            note=note,
            errors=errors,
        )
        if result.passed:
            steps[name] = variant.step
    comparison = time_passing(
        rows,
        steps,
        call_seconds=step_seconds,
        seconds_left=budget_s - (time.perf_counter() - start),
        unit="step",
        items=items,
        device=dev,
        memory=True,
        label="training step",
        progress=progress,
    )
    if comparison is not None and "torch.compile" in comparison.names:
        rows["torch.compile"] = with_break_even(
            rows["torch.compile"], comparison, compile_cost_found, compile_first, "steps"
        )
    report = AdviceReport(
        kind="training",
        device=str(dev),
        rows=tuple(rows[n] for n in chosen),
        comparison=comparison,
        stacked=None,
        stacked_check="-",
        budget_s=budget_s,
        seconds_used=0.0,
        memory_budget_bytes=memory_budget_bytes,
        baseline_saved_bytes=comparison["baseline"].memory.saved_bytes if comparison is not None else None,
    )
    stacked, stacked_check = _stack(
        report, loop, reference, exact_tolerance, lossy_tolerance, items, dev, start, budget_s, step_seconds, progress
    )
    report = replace(report, stacked=stacked, stacked_check=stacked_check)
    if batch_sizes:
        report = replace(
            report,
            batch_sizes=_time_batch_sizes(
                make_model,
                make_batch,
                make_optimizer,
                loss_fn,
                dev,
                batch_sizes,
                items,
                step_seconds,
                start,
                budget_s,
                progress,
            ),
        )
    return replace(report, seconds_used=time.perf_counter() - start)


def _time_batch_sizes(
    make_model, make_batch, make_optimizer, loss_fn, dev, sizes, items, step_seconds, start, budget_s, progress
):
    """The baseline step at each batch size, by throughput; None (with the reason in the report) past the budget."""
    left = budget_s - (time.perf_counter() - start)
    needed = CALLS_PER_VARIANT * step_seconds * sum(b / items for b in sizes)
    if needed > left:
        return f"not timed: {len(sizes)} batch sizes need about {needed:.0f} s, {max(left, 0):.0f} s were left (raise budget_s)"
    steps, counts = {}, {}
    for b in sizes:
        try:
            batch = make_batch(batch_size=b)
        except TypeError as err:
            raise TypeError(
                f"with batch_sizes=, make_batch must take batch_size= (e.g. def make_batch(batch_size=32)): {err}"
            ) from None
        x, y = batch_on(batch, dev)
        loop = _Loop(make_model, make_optimizer, loss_fn, x, y, dev, TrainingSwitches())
        steps[f"batch {b}"], counts[f"batch {b}"] = loop.step, b
    return compare(
        steps,
        baseline=f"batch {sizes[0]}",
        items=counts,
        device=dev,
        budget=Budget(min_run_time=max(0.05, 0.3 * left / len(sizes)), min_rounds=TIMED_ROUNDS),
        label="the baseline training step by batch size (throughput)",
        progress=progress,
    )


def _stack(
    report, loop, reference, exact, lossy, items, dev, start, budget_s, step_seconds, progress
) -> tuple[Comparison | None, str]:
    chosen = report.recommended
    if not chosen:
        return None, "-"
    left = budget_s - (time.perf_counter() - start)
    if left < 2 * CALLS_PER_VARIANT * step_seconds:
        return None, f"not run: the budget ran out (one step {step_seconds:.2f} s; raise budget_s)"
    switches = _combine([SWITCH_OF[r.name] for r in chosen if r.name in SWITCH_OF])
    try:
        base, stacked = loop(TrainingSwitches()), loop(switches)
        result = check_step(stacked.checked_step(), reference, lossy if any(r.name in LOSSY for r in chosen) else exact)
    except Exception as err:
        return None, raised_row("stacked", err).check
    if not result.passed:
        return None, result.text()
    comparison = time_stacked(
        base.step,
        stacked.step,
        seconds_left=budget_s - (time.perf_counter() - start),
        items=items,
        device=dev,
        memory=True,
        label="training step",
        progress=progress,
    )
    return comparison, result.text()
