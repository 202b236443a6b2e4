"""Time to a target accuracy, one training trick added at a time: airbench94's recipe as a ladder.

One training function, ``train_to_target(config, data, seed=...)``, whose tricks are the fields of
one frozen ``LadderConfig``: every rung of the ladder runs this same code with one option changed.
It trains airbench94's network (``tricks_lib.ladder.airbench``) on a fixed schedule, evaluates after each
epoch and stops at the first evaluation at or above the target (``run_to_target``), as DAWNBench
and airbench measure "time to 94%". Each stretch (setup, each epoch, each evaluation) is timed
like a first call (``time_first_call``: device synchronized before and after), because a whole
training run is a one-off cost, not a loop to average; compile time lands inside the first epoch
and is also reported on its own.

The data (``ImageData``, ``photo_data``, ``cifar10_data``, ``augment_batch``) live in
``tricks_lib.ladder.images`` and the results (``Rung``, ``RungResult``, ``Ladder``) in
``tricks_lib.ladder.results``; the package ``tricks_lib.ladder`` re-exports all three modules.

``run_ladder(base, rungs, data, seeds=...)`` stacks the rungs (each keeps the changes before it),
trains every rung from the same seeds and returns a ``Ladder`` (mean and spread over seeds, a
verdict per rung against the one before, ``plot()``, ``summary_rows()`` for the run summary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from tricks_lib.env import pick_device
from tricks_lib.ladder.airbench import init_whitening, make_airbench94
from tricks_lib.ladder.config import LadderConfig, TargetTrace, TrainingRun
from tricks_lib.ladder.images import HostAugmentedDataset, ImageData, augment_batch
from tricks_lib.ladder.results import Ladder, Rung, RungResult
from tricks_lib.memory import measure_memory
from tricks_lib.progress import optional_progress_bar
from tricks_lib.timing import time_first_call

__all__ = ["lr_factor", "make_training_step", "run_ladder", "run_to_target", "train_to_target", "unsupported_reason"]


def lr_factor(step: int, total_steps: int, warmup_fraction: float, *, start: float = 0.2, end: float = 0.07) -> float:
    """LR multiplier at ``step``: linear from ``start`` to 1 over the warm-up, then linear to ``end`` at the last step.

    Without warm-up it starts at 1. With ``warmup_fraction=0.23`` it is airbench94's triangle schedule.
    """
    peak = int(warmup_fraction * total_steps)
    if step < peak:
        return start + (1 - start) * step / peak
    return 1 + (end - 1) * (step - peak) / max(total_steps - peak, 1)


# --------------------------------------------------------------------------------------------- timing
def run_to_target(
    train_epoch: Callable[[int], object],
    evaluate: Callable[[], float],
    *,
    epochs: int,
    target: float,
    setup_seconds: float = 0.0,
    stop_at_target: bool = True,
    device: str | torch.device | None = None,
) -> TargetTrace:
    """Train epoch by epoch and evaluate after each, stopping at the first evaluation at or above ``target``.

    Each epoch and each evaluation is timed as a first call (device synchronized before and after).

    Args:
        train_epoch: trains one epoch; called with the epoch index.
        evaluate: returns the test accuracy in [0, 1].
        epochs: the schedule's length (the most epochs run).
        target: the accuracy that stops the run.
        setup_seconds: seconds spent before the first epoch, counted in the elapsed times.
        stop_at_target: False runs the whole schedule and still records the first time at the target.
        device: whose queue is synchronized (default ``pick_device()``).
    """
    accuracies, elapsed, train_seconds, clock = [], [], [], setup_seconds
    for epoch in range(epochs):
        seconds = time_first_call(lambda e=epoch: train_epoch(e), device=device)
        box: list[float] = []
        clock += seconds + time_first_call(lambda b=box: b.append(float(evaluate())), device=device)
        accuracies.append(box[0])
        elapsed.append(clock)
        train_seconds.append(seconds)
        if stop_at_target and box[0] >= target:
            break
    return TargetTrace(tuple(accuracies), tuple(elapsed), tuple(train_seconds), target)


def _make_optimizer(model: torch.nn.Module, config: LadderConfig) -> torch.optim.Optimizer:
    norm_biases = [p for n, p in model.named_parameters() if "norm" in n and n.endswith("bias") and p.requires_grad]
    others = [p for n, p in model.named_parameters() if p.requires_grad and not any(p is q for q in norm_biases)]
    lr, scaler = config.lr, config.bias_scaler
    impl = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        config.optimizer_impl
    ]
    groups = [
        {"params": norm_biases, "lr": lr * scaler, "weight_decay": config.weight_decay / scaler},
        {"params": others, "lr": lr, "weight_decay": config.weight_decay},
    ]
    return torch.optim.SGD(groups, lr=lr, momentum=config.momentum, nesterov=True, **impl)


def _autocast(config: LadderConfig, device: torch.device):
    return torch.autocast(
        device.type, dtype=config.autocast_dtype or torch.float32, enabled=config.autocast_dtype is not None
    )


def train_to_target(
    config: LadderConfig,
    data: ImageData,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    stop_at_target: bool = True,
) -> TrainingRun:
    """Train airbench94's network with ``config``'s tricks until the test accuracy reaches ``config.target``.

    The same code for every rung: each trick is an ``if`` on one field of ``config``. Seeds fix the
    initial weights, the shuffling and the augmentation, so rungs that compute the same function
    (memory layout, optimizer implementation) see the same batches.

    Returns:
        A ``TrainingRun``; its ``time_to_target`` is None when the schedule ended below the target.
    """
    if not isinstance(config, LadderConfig) or not isinstance(data, ImageData):
        raise TypeError("train_to_target(config, data) needs a LadderConfig and an ImageData")
    dev = pick_device(device) if device is not None else pick_device()
    run, setup_seconds = _set_up_training(config, data, seed, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    trace = run_to_target(
        lambda epoch: _train_epoch(run, epoch), lambda: _evaluate(run), epochs=config.epochs, target=config.target,
        setup_seconds=setup_seconds, stop_at_target=stop_at_target, device=dev,
    )  # fmt: skip
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    return _training_run(run, trace, seed=seed, setup_seconds=setup_seconds, peak_memory_bytes=peak)


@dataclasses.dataclass
class _Training:
    """One training run in progress: what its steps share (model, tools, data on the device) and its counters."""

    config: LadderConfig
    device: torch.device
    memory_format: torch.memory_format
    model: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]  # the model, or torch.compile(model)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    loader: torch.utils.data.DataLoader | None  # None: batches come from the augmented images on the device
    generator: torch.Generator  # on the device: augmentation and shuffling of on-device batches
    on_device: dict[str, torch.Tensor]
    steps_per_epoch: int
    total_steps: int
    steps_done: int = 0
    first_step_seconds: float = 0.0
    whiten_bias_frozen: bool = False
    lookahead: dict[str, torch.Tensor] | None = None


def _set_up_training(config: LadderConfig, data: ImageData, seed: int, dev: torch.device) -> tuple[_Training, float]:
    """Build the model, its optimizer, schedule and batches from ``seed``; also the seconds of the timed setup.

    The timed setup is the data's move to the device (and the whitening's initialization from it).
    """
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    torch.manual_seed(seed)
    model = make_airbench94(
        config.width, num_classes=len(data.class_names), frozen_bn_scales=config.whitening,
        frozen_whitening=config.whitening,
    ).to(dev, memory_format=memory_format)  # fmt: skip
    mean, std = data.mean.to(dev).view(1, 3, 1, 1), data.std.to(dev).view(1, 3, 1, 1)
    generator = torch.Generator(dev).manual_seed(seed)
    on_device: dict[str, torch.Tensor] = {}

    def setup() -> None:
        test = ((data.test_images.to(dev).float() / 255 - mean) / std).contiguous(memory_format=memory_format)
        on_device["test"], on_device["test_labels"] = test, data.test_labels.to(dev)
        if config.on_device_data or config.whitening:
            train = (data.train_images.to(dev).float() / 255 - mean) / std  # (N, 3, H, W) float, normalized once
            on_device["train"], on_device["train_labels"] = train, data.train_labels.to(dev)
        if config.whitening:
            init_whitening(model.whiten, on_device["train"][:5000])

    setup_seconds = time_first_call(setup, device=dev)
    optimizer = _make_optimizer(model, config)
    steps_per_epoch = len(data.train_labels) // config.batch_size  # drop_last: one batch shape, one compile
    if steps_per_epoch < 1:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {len(data.train_labels)} training images")
    total_steps = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(min(s, total_steps), total_steps, config.warmup_fraction)
    )
    scaler = torch.amp.GradScaler(dev.type, enabled=config.autocast_dtype == torch.float16)
    forward = torch.compile(model) if config.compile else model
    run = _Training(
        config=config,
        device=dev,
        memory_format=memory_format,
        model=model,
        forward=forward,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        loader=None if config.on_device_data else _host_loader(config, data, seed, dev),
        generator=generator,
        on_device=on_device,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
    )
    return run, setup_seconds


def _host_loader(config: LadderConfig, data: ImageData, seed: int, dev: torch.device) -> torch.utils.data.DataLoader:
    """Batches augmented on the host by a DataLoader, shuffled from ``seed``."""
    dataset = HostAugmentedDataset(data.train_images, data.train_labels, data.mean, data.std, config.translate, seed)
    return torch.utils.data.DataLoader(
        dataset, batch_size=config.batch_size, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(seed), pin_memory=dev.type == "cuda",
    )  # fmt: skip


def _batches(run: _Training):
    """One epoch's (images, labels) batches on the device, from the loader or from the images already there."""
    config, dev = run.config, run.device
    if run.loader is not None:
        for x, y in run.loader:
            yield x.to(dev, non_blocking=True).contiguous(memory_format=run.memory_format), y.to(dev, non_blocking=True)
        return
    images = augment_batch(run.on_device["train"], translate=config.translate, generator=run.generator)
    images = images.contiguous(memory_format=run.memory_format)
    order = torch.randperm(len(images), device=dev, generator=run.generator)
    for i in range(run.steps_per_epoch):
        idx = order[i * config.batch_size : (i + 1) * config.batch_size]
        yield images[idx], run.on_device["train_labels"][idx]


def _step(run: _Training, x: torch.Tensor, y: torch.Tensor) -> None:
    """One optimizer step on the batch ``x`` (B, 3, H, W), ``y`` (B,): forward, loss, backward, update."""
    with _autocast(run.config, run.device):
        loss = F.cross_entropy(run.forward(x), y, label_smoothing=run.config.label_smoothing)
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    if run.whiten_bias_frozen:  # no gradient: SGD skips the parameter (a requires_grad flip would recompile)
        run.model.whiten.bias.grad = None
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()


def _after_step(run: _Training) -> None:
    """Count the step; every 5th step from 30% of the schedule, airbench's lookahead EMA (when the config has it)."""
    run.steps_done += 1
    steps, total = run.steps_done, run.total_steps
    if run.config.lookahead and steps >= 0.3 * total and steps % 5 == 0:
        run.lookahead = _lookahead_update(run.model, run.lookahead, (0.95**5) * (steps / total) ** 3)


def _start_epoch(run: _Training, epoch: int) -> None:
    run.model.train()
    # airbench trains the whitening layer's bias for the first 3 of its 9.9 epochs, then freezes it
    run.whiten_bias_frozen = run.config.whitening and epoch >= max(1, round(run.config.epochs * 0.3))


def _train_epoch(run: _Training, epoch: int) -> None:
    """One epoch of steps; the run's very first step is timed on its own (it holds the compile time)."""
    _start_epoch(run, epoch)
    for x, y in _batches(run):
        if run.steps_done == 0:
            run.first_step_seconds = time_first_call(lambda x=x, y=y: _step(run, x, y), device=run.device)
        else:
            _step(run, x, y)
        _after_step(run)
    if run.lookahead is not None:
        _lookahead_update(run.model, run.lookahead, 1.0)


def make_training_step(
    config: LadderConfig, data: ImageData, *, seed: int = 0, device: str | torch.device | None = None
) -> Callable[[], None]:
    """A zero-argument callable that runs one of ``config``'s training steps per call, for timing throughput.

    Each call takes the next batch from the rung's own input pipeline (the host ``DataLoader``, or the
    images already on the device) and runs the same step ``train_to_target`` runs: forward, loss,
    backward, optimizer and schedule, lookahead. The steps continue from the middle of the schedule, so
    what acts only later in a run (lookahead from 30% of the steps, the whitening bias frozen after 30%
    of the epochs) is on, as in most of a run's steps (past the schedule's end they go back to its
    middle, at an epoch's start). A new epoch's work (the loader's new iterator, or
    the on-device augmentation and shuffle of the whole training set) runs inside the call that needs
    its first batch. With ``compile``, the first call compiles: warm it up before timing (``compare`` does).

    Args:
        config: the rung's configuration.
        data: the training images (the test images are moved to the device but not used).
        seed: fixes the weights, the shuffling and the augmentation.
        device: where to train (default ``pick_device()``).

    Returns:
        The step; it returns None (its loss stays on the device: no host sync beyond the step's own).
    """
    if not isinstance(config, LadderConfig) or not isinstance(data, ImageData):
        raise TypeError("make_training_step(config, data) needs a LadderConfig and an ImageData")
    dev = pick_device(device) if device is not None else pick_device()
    run, _ = _set_up_training(config, data, seed, dev)
    run.steps_done = run.total_steps // 2
    batches = iter(())

    def step() -> None:
        nonlocal batches
        batch = next(batches, None)
        if batch is None:  # the epoch's end as _train_epoch ends it; the next epoch's batches start here
            if run.lookahead is not None:
                _lookahead_update(run.model, run.lookahead, 1.0)
            if run.steps_done >= run.total_steps:  # past the schedule: back to its middle, so it never ends
                run.steps_done = run.total_steps // 2
            _start_epoch(run, run.steps_done // run.steps_per_epoch)
            batches = _batches(run)
            batch = next(batches)
        _step(run, *batch)
        _after_step(run)

    return step


def _evaluate(run: _Training) -> float:
    """Test accuracy in [0, 1] (with flip test-time augmentation when the config asks for it)."""
    config, model, test, labels = run.config, run.model, run.on_device["test"], run.on_device["test_labels"]
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=run.device)
    with torch.inference_mode(), _autocast(config, run.device):
        for x, y in zip(test.split(config.eval_batch_size), labels.split(config.eval_batch_size)):
            logits = model(x)
            if config.flip_tta:
                logits = 0.5 * logits + 0.5 * model(x.flip(-1))
            correct += (logits.argmax(1) == y).sum()
    return correct.item() / len(labels)


def _training_run(
    run: _Training, trace: TargetTrace, *, seed: int, setup_seconds: float, peak_memory_bytes: int | None
) -> TrainingRun:
    """The run's result: throughput without the compile time, and what autograd saves for one step."""
    config, steps = run.config, run.steps_done
    typical = (sum(trace.train_seconds) - run.first_step_seconds) / max(steps - 1, 1)
    compile_seconds = max(run.first_step_seconds - typical, 0.0) if config.compile else None
    train_time = sum(trace.train_seconds) - (compile_seconds or 0.0)
    x, y = next(_batches(run))  # one more step, only to count what autograd saves (exact on every device)
    saved = measure_memory(
        lambda: run.scaler.scale(F.cross_entropy(_eager_forward(run.model, x, config, run.device), y)).backward(),
        device=run.device,
    )
    return TrainingRun(
        seed=seed,
        trace=trace,
        images_per_second=steps * config.batch_size / train_time,
        compile_seconds=compile_seconds,
        setup_seconds=setup_seconds,
        peak_memory_bytes=peak_memory_bytes,
        saved_bytes=saved.saved_bytes,
    )


def _eager_forward(model, x, config, dev):
    model.train()
    with _autocast(config, dev):
        return model(x)


@torch.no_grad()
def _lookahead_update(model: torch.nn.Module, ema: dict | None, decay: float) -> dict:
    """airbench's LookaheadState: move the EMA towards the weights, then copy it back into the network."""
    state = model.state_dict()
    if ema is None:
        return {k: v.clone() for k, v in state.items()}
    for key, value in state.items():
        if value.dtype.is_floating_point:
            ema[key].lerp_(value, 1 - decay)
            value.copy_(ema[key])
    return ema


# --------------------------------------------------------------------------------------------- ladder
def unsupported_reason(changes: dict, device: str | torch.device) -> str | None:
    """Why a rung's ``changes`` need hardware ``device`` lacks, or None when they run there as meant.

    fp16 autocast with GradScaler is a CUDA recipe (CPU autocast is built for bf16); bf16 autocast
    needs a device whose autocast type is bf16 (``training.autocast_dtype``: CPUs, CUDA from compute
    capability 8.0; below it bf16 is emulated).
    """
    from tricks_lib.training.steps import autocast_dtype

    dev = torch.device(device)
    wanted = changes.get("autocast_dtype")
    if wanted == torch.float16 and dev.type != "cuda":
        return "CUDA only: CPU autocast is built for bf16"
    if wanted == torch.bfloat16 and autocast_dtype(dev) != torch.bfloat16:
        return "bf16 is emulated below compute capability 8.0"
    return None


def _skip_reasons(rungs: Sequence[Rung], device: torch.device | None) -> list[Rung]:
    """The rungs, each unsupported one (``unsupported_reason`` on ``device``; None: none checked) skipped."""
    if device is None:
        return list(rungs)
    return [
        dataclasses.replace(r, skip_reason=unsupported_reason(r.changes, device)) if r.skip_reason is None else r
        for r in rungs
    ]


def _cumulative(base: LadderConfig, rungs: Sequence[Rung]) -> list[LadderConfig | None]:
    configs, current = [], base
    for rung in rungs:
        if rung.skip_reason is not None:
            configs.append(None)
            continue
        current = dataclasses.replace(current, **rung.changes)
        configs.append(current)
    return configs


def run_ladder(
    base: LadderConfig,
    rungs: Sequence[Rung],
    data: ImageData,
    *,
    seeds: Sequence[int] = (0, 1),
    device: str | torch.device | None = None,
    context: Callable[[Rung], object] | None = None,
    warmup: bool = True,
    progress: bool = False,
    skip_unsupported: bool = False,
) -> Ladder:
    """Train every rung (the first one is the baseline: usually ``Rung("baseline")``) from each seed.

    Rung ``i`` runs ``base`` with the changes of every rung up to ``i`` that is not skipped. Each seed
    climbs the whole ladder in order before the next seed starts.

    Args:
        base: the baseline's config; ``base.target`` is every rung's target.
        rungs: the tricks in order.
        data: the train/test split.
        seeds: one run per seed per rung.
        device: where to train (default ``pick_device()``).
        context: optional ``context(rung)`` returning a context manager each of the rung's runs
            happens in (e.g. ``fresh_compile_cache()`` for the first compiled rung: a cold compile per seed).
        warmup: before timing, train each rung's config (eager) for two untimed steps on a few
            images, so that no rung pays the creation of its kernels inside its time to target.
        progress: a progress bar over the training runs (off under ``TRICKS_PROGRESS=0``).
        skip_unsupported: skip each rung whose own changes need hardware this device lacks, with
            ``unsupported_reason`` as its skip reason (fp16 + GradScaler off CUDA, bf16 where emulated).
    """
    import contextlib

    if not rungs:
        raise ValueError("rungs is empty: pass at least Rung('baseline')")
    if not seeds:
        raise ValueError("seeds is empty: pass at least one seed")
    dev = pick_device(device) if device is not None else pick_device()
    rungs = _skip_reasons(rungs, dev if skip_unsupported else None)
    configs = _cumulative(base, rungs)
    ran = [(rung, config) for rung, config in zip(rungs, configs) if config is not None]
    if warmup:  # untimed: each config's eager kernels are created once (oneDNN/cuDNN pick them at first use)
        for _, config in ran:
            small = dataclasses.replace(config, epochs=1, compile=False, target=1.0)
            n = min(2 * config.batch_size, len(data.train_labels))
            subset = dataclasses.replace(data, train_images=data.train_images[:n], train_labels=data.train_labels[:n])
            train_to_target(small, subset, seed=0, device=dev)
    bar = optional_progress_bar(progress, len(seeds) * len(ran), "training the ladder")
    runs: dict[str, list[TrainingRun]] = {rung.name: [] for rung, _ in ran}
    try:
        # Seed by seed, each seed climbing the whole ladder: a machine that slows down over time then
        # shows up in every rung's spread, not as a fake gain of the rungs trained last.
        for seed in seeds:
            for rung, config in ran:
                with context(rung) if context is not None else contextlib.nullcontext():
                    runs[rung.name].append(train_to_target(config, data, seed=seed, device=dev))
                if bar is not None:
                    bar.set_postfix_str(rung.name)
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    results = [
        RungResult(rung.name, config, tuple(runs[rung.name])) if config is not None
        else RungResult(rung.name, None, (), rung.skip_reason)
        for rung, config in zip(rungs, configs)
    ]  # fmt: skip
    return Ladder(tuple(results), data.name, str(dev), base.target)
