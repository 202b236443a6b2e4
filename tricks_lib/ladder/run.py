"""Time to a target accuracy, one training trick added at a time: airbench94's recipe as a ladder.

The training step is the caller's: ``build_step(config, model, total_steps, device)`` (the capstone
notebook writes it out, every trick a line switched by a field of ``config``) returns ``step(x, y, i)``,
one optimizer step on a batch, ``i`` the step's index in the run. This module measures it.
``train_to_target(config, data, build_step, seed=...)`` builds airbench94's network from the seed
(``tricks_lib.ladder.airbench``), moves the data to the device (and initializes the whitening conv from
it when ``config.whitening``), feeds the step its batches (a host ``DataLoader``, or the images already
on the device when ``config.on_device_data``), evaluates after each epoch (flip test-time augmentation
when ``config.flip_tta``) and stops at the first evaluation at or above the target (``run_to_target``),
as DAWNBench and airbench measure "time to 94%". Each stretch (setup, each epoch, each evaluation) is
timed like a first call (``time_first_call``: device synchronized before and after), because a whole
training run is a one-off cost, not a loop to average; compile time lands inside the first step and
is also reported on its own.

``run_ladder(base, rungs, data, build_step, seeds=...)`` stacks the rungs (each keeps the changes before
it), trains every rung from the same seeds, times each rung's step against the others (``compare``,
paired) and returns a ``Ladder`` (mean and spread over seeds, a verdict per rung against the one before,
``epochs_change``, ``compile_payback``, ``plot()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from tricks_lib.comparing import DEFAULT_BUDGET, Budget, compare
from tricks_lib.compiling import fresh_compile_cache
from tricks_lib.env import pick_device
from tricks_lib.ladder.airbench import init_whitening, make_airbench94
from tricks_lib.ladder.config import LadderConfig, TargetTrace, TrainingRun
from tricks_lib.ladder.images import HostAugmentedDataset, ImageData, augment_batch
from tricks_lib.ladder.results import Ladder, Rung, RungResult
from tricks_lib.memory import measure_memory
from tricks_lib.progress import optional_progress_bar
from tricks_lib.timing import time_first_call

__all__ = ["BuildStep", "run_ladder", "run_to_target", "train_to_target", "unsupported_reason"]

# build_step(config, model, total_steps, device) -> step(x, y, i): the caller's training step (see the docstring).
BuildStep = Callable[
    [LadderConfig, torch.nn.Module, int, torch.device], Callable[[torch.Tensor, torch.Tensor, int], object]
]


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


def train_to_target(
    config: LadderConfig,
    data: ImageData,
    build_step: BuildStep,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    stop_at_target: bool = True,
) -> TrainingRun:
    """Train airbench94's network with ``build_step``'s step for ``config`` until the test accuracy reaches the target.

    The same measuring code for every rung. Seeds fix the initial weights, the shuffling and the
    augmentation, so rungs that compute the same function (memory layout, optimizer implementation)
    see the same batches.

    Returns:
        A ``TrainingRun``; its ``time_to_target`` is None when the schedule ended below the target.

    Raises:
        TypeError: ``config`` is not a ``LadderConfig``, ``data`` not an ``ImageData`` or ``build_step`` not callable.
    """
    _check(config, data, build_step)
    dev = pick_device(device) if device is not None else pick_device()
    run, setup_seconds = _set_up_training(config, data, build_step, seed, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    trace = run_to_target(
        lambda epoch: _train_epoch(run), lambda: _evaluate(run), epochs=config.epochs, target=config.target,
        setup_seconds=setup_seconds, stop_at_target=stop_at_target, device=dev,
    )  # fmt: skip
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    return _training_run(run, trace, seed=seed, setup_seconds=setup_seconds, peak_memory_bytes=peak)


def _check(config: object, data: object, build_step: object) -> None:
    if not isinstance(config, LadderConfig) or not isinstance(data, ImageData) or not callable(build_step):
        raise TypeError("needs a LadderConfig, an ImageData and a build_step(config, model, total_steps, device)")


@dataclasses.dataclass
class _Training:
    """One training run in progress: its model and step, the data on the device and the step counter."""

    config: LadderConfig
    device: torch.device
    model: torch.nn.Module
    step: Callable[[torch.Tensor, torch.Tensor, int], object]  # the caller's step(x, y, i)
    loader: torch.utils.data.DataLoader | None  # None: batches come from the augmented images on the device
    generator: torch.Generator  # on the device: augmentation and shuffling of on-device batches
    on_device: dict[str, torch.Tensor]
    steps_per_epoch: int
    total_steps: int
    steps_done: int = 0
    first_step_seconds: float = 0.0


def _set_up_training(
    config: LadderConfig, data: ImageData, build_step: BuildStep, seed: int, dev: torch.device
) -> tuple[_Training, float]:
    """Build the model from ``seed``, its step and its batches; also the seconds of the timed setup.

    The timed setup is the data's move to the device (and the whitening's initialization from it).
    """
    steps_per_epoch = len(data.train_labels) // config.batch_size  # drop_last: one batch shape, one compile
    if steps_per_epoch < 1:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {len(data.train_labels)} training images")
    torch.manual_seed(seed)
    model = make_airbench94(
        config.width, num_classes=len(data.class_names), frozen_bn_scales=config.whitening,
        frozen_whitening=config.whitening,
    ).to(dev)  # fmt: skip
    mean, std = data.mean.to(dev).view(1, 3, 1, 1), data.std.to(dev).view(1, 3, 1, 1)
    evaluation_format = torch.channels_last if config.channels_last else torch.contiguous_format
    on_device: dict[str, torch.Tensor] = {}

    def setup() -> None:
        test = ((data.test_images.to(dev).float() / 255 - mean) / std).contiguous(memory_format=evaluation_format)
        on_device["test"], on_device["test_labels"] = test, data.test_labels.to(dev)
        if config.on_device_data or config.whitening:
            train = (data.train_images.to(dev).float() / 255 - mean) / std  # (N, 3, H, W) float, normalized once
            on_device["train"], on_device["train_labels"] = train, data.train_labels.to(dev)
        if config.whitening:
            init_whitening(model.whiten, on_device["train"][:5000])

    setup_seconds = time_first_call(setup, device=dev)
    total_steps = steps_per_epoch * config.epochs
    run = _Training(
        config=config,
        device=dev,
        model=model,
        step=build_step(config, model, total_steps, dev),
        loader=None if config.on_device_data else _host_loader(config, data, seed, dev),
        generator=torch.Generator(dev).manual_seed(seed),
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
            yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        return
    images = augment_batch(run.on_device["train"], translate=config.translate, generator=run.generator)
    order = torch.randperm(len(images), device=dev, generator=run.generator)
    for i in range(run.steps_per_epoch):
        idx = order[i * config.batch_size : (i + 1) * config.batch_size]
        yield images[idx], run.on_device["train_labels"][idx]


def _train_epoch(run: _Training) -> None:
    """One epoch of steps; the run's very first step is timed on its own (it holds the compile time)."""
    run.model.train()
    for x, y in _batches(run):
        if run.steps_done == 0:
            run.first_step_seconds = time_first_call(lambda x=x, y=y: run.step(x, y, 0), device=run.device)
        else:
            run.step(x, y, run.steps_done)
        run.steps_done += 1


def _pipeline_step(
    config: LadderConfig, data: ImageData, build_step: BuildStep, *, seed: int = 0,
    device: str | torch.device | None = None,
) -> Callable[[], None]:  # fmt: skip
    """A zero-argument callable that runs one of ``config``'s training steps per call, for timing throughput.

    Each call takes the next batch from the rung's own input pipeline (the host ``DataLoader``, or the
    images already on the device) and runs the step ``train_to_target`` runs, from the middle of the
    schedule on (past its end, back to its middle), so that what acts only later in a run is on. A new
    epoch's work (the loader's new iterator, or the on-device augmentation and shuffle of the whole
    training set) runs inside the call that needs its first batch. With ``compile``, the first call
    compiles: warm it up before timing (``compare`` does).
    """
    _check(config, data, build_step)
    dev = pick_device(device) if device is not None else pick_device()
    run, _ = _set_up_training(config, data, build_step, seed, dev)
    run.model.train()
    run.steps_done = run.total_steps // 2
    batches = iter(())

    def step() -> None:
        nonlocal batches
        batch = next(batches, None)
        if batch is None:  # an epoch's end: the next epoch's batches start here
            batches = _batches(run)
            batch = next(batches)
        run.step(*batch, run.steps_done)
        run.steps_done = run.steps_done + 1 if run.steps_done + 1 < run.total_steps else run.total_steps // 2

    return step


def _evaluate(run: _Training) -> float:
    """Test accuracy in [0, 1] (with flip test-time augmentation when the config asks for it)."""
    config, model, test, labels = run.config, run.model, run.on_device["test"], run.on_device["test_labels"]
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=run.device)
    with torch.inference_mode(), _autocast(config, run.device):
        for x, y in zip(test.split(config.eval_batch_size), labels.split(config.eval_batch_size)):
            logits = model(x)
            if config.flip_tta:  # airbench's test-time augmentation: the mirror image's logits averaged in
                logits = 0.5 * logits + 0.5 * model(x.flip(-1))
            correct += (logits.argmax(1) == y).sum()
    return correct.item() / len(labels)


def _autocast(config: LadderConfig, device: torch.device):
    dtype = config.autocast_dtype
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def _training_run(
    run: _Training, trace: TargetTrace, *, seed: int, setup_seconds: float, peak_memory_bytes: int | None
) -> TrainingRun:
    """The run's result: throughput without the compile time, and what autograd saves for one step."""
    config, steps = run.config, run.steps_done
    typical = (sum(trace.train_seconds) - run.first_step_seconds) / max(steps - 1, 1)
    compile_seconds = max(run.first_step_seconds - typical, 0.0) if config.compile else None
    train_time = sum(trace.train_seconds) - (compile_seconds or 0.0)
    x, y = next(_batches(run))  # one more forward and backward, only to count what autograd saves (exact anywhere)
    if config.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    saved = measure_memory(lambda: F.cross_entropy(_train_forward(run, x), y).backward(), device=run.device)
    return TrainingRun(
        seed=seed,
        trace=trace,
        images_per_second=steps * config.batch_size / train_time,
        compile_seconds=compile_seconds,
        setup_seconds=setup_seconds,
        peak_memory_bytes=peak_memory_bytes,
        saved_bytes=saved.saved_bytes,
    )


def _train_forward(run: _Training, x: torch.Tensor) -> torch.Tensor:
    run.model.train()
    with _autocast(run.config, run.device):
        return run.model(x)


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
    build_step: BuildStep,
    *,
    seeds: Sequence[int] = (0, 1),
    device: str | torch.device | None = None,
    warmup: bool = True,
    progress: bool = False,
    skip_unsupported: bool = False,
    step_budget: Budget | None = DEFAULT_BUDGET,
) -> Ladder:
    """Train every rung (the first one is the baseline: usually ``Rung("baseline")``) from each seed, with
    ``build_step``'s step, and time each rung's step against the others.

    Rung ``i`` runs ``base`` with the changes of every rung up to ``i`` that is not skipped. Each seed
    climbs the whole ladder in order before the next seed starts. Every run of the first compiled rung
    starts from an empty compile cache (``fresh_compile_cache``): each seed pays a cold compile, as a
    reader's first run does.

    Args:
        base: the baseline's config; ``base.target`` is every rung's target.
        rungs: the tricks in order.
        data: the train/test split.
        build_step: ``build_step(config, model, total_steps, device)`` returns ``step(x, y, i)``.
        seeds: one run per seed per rung.
        device: where to train (default ``pick_device()``).
        warmup: before timing, train each rung's config (eager) for two untimed steps on a few
            images, so that no rung pays the creation of its kernels inside its time to target.
        progress: progress bars over the training runs and the step comparison (off under ``TRICKS_PROGRESS=0``).
        skip_unsupported: skip each rung whose own changes need hardware this device lacks, with
            ``unsupported_reason`` as its skip reason (fp16 + GradScaler off CUDA, bf16 where emulated).
        step_budget: the time budget of the step comparison (``Ladder.steps``: each rung's step on its own
            input pipeline, from the first seed, timed with ``compare``, items its batch size); None: none.

    Raises:
        ValueError: no rungs or no seeds. TypeError: see ``train_to_target``.
    """
    if not rungs:
        raise ValueError("rungs is empty: pass at least Rung('baseline')")
    if not seeds:
        raise ValueError("seeds is empty: pass at least one seed")
    _check(base, data, build_step)
    dev = pick_device(device) if device is not None else pick_device()
    rungs = _skip_reasons(rungs, dev if skip_unsupported else None)
    configs = _cumulative(base, rungs)
    ran = [(rung, config) for rung, config in zip(rungs, configs) if config is not None]
    first_compiled = next((rung.name for rung, config in ran if config.compile), None)
    if warmup:  # untimed: each config's eager kernels are created once (oneDNN/cuDNN pick them at first use)
        for _, config in ran:
            small = dataclasses.replace(config, epochs=1, compile=False, target=1.0)
            n = min(2 * config.batch_size, len(data.train_labels))
            subset = dataclasses.replace(data, train_images=data.train_images[:n], train_labels=data.train_labels[:n])
            train_to_target(small, subset, build_step, seed=0, device=dev)
    bar = optional_progress_bar(progress, len(seeds) * len(ran), "training the ladder")
    runs: dict[str, list[TrainingRun]] = {rung.name: [] for rung, _ in ran}
    try:
        # Seed by seed, each seed climbing the whole ladder: a machine that slows down over time then
        # shows up in every rung's spread, not as a fake gain of the rungs trained last.
        for seed in seeds:
            for rung, config in ran:
                with fresh_compile_cache() if rung.name == first_compiled else contextlib.nullcontext():
                    runs[rung.name].append(train_to_target(config, data, build_step, seed=seed, device=dev))
                if bar is not None:
                    bar.set_postfix_str(rung.name)
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    steps = None
    if step_budget is not None:
        steps = compare(
            {rung.name: _pipeline_step(config, data, build_step, seed=seeds[0], device=dev) for rung, config in ran},
            baseline=ran[0][0].name, items={rung.name: config.batch_size for rung, config in ran}, device=dev,
            budget=step_budget, progress=progress, label="one training step per rung",
        )  # fmt: skip
    results = [
        RungResult(rung.name, config, tuple(runs[rung.name])) if config is not None
        else RungResult(rung.name, None, (), rung.skip_reason)
        for rung, config in zip(rungs, configs)
    ]  # fmt: skip
    return Ladder(tuple(results), data.name, str(dev), base.target, steps)
