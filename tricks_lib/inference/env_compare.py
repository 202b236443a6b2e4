"""Time one snippet under several process environments: allocators, OpenMP settings, anything read at start.

Some settings only act when a process starts: ``LD_PRELOAD`` (a faster ``malloc`` such as jemalloc or
tcmalloc), ``OMP_NUM_THREADS``, ``KMP_AFFINITY``, ``MALLOC_CONF``. Setting them in a running kernel
changes nothing, so ``compare_environments`` starts one worker process per environment, runs the
setup there once, and then asks the workers for timed blocks round by round, in an order shuffled per
round, exactly like ``compare`` does with callables in one process. The rows and their significance
come from the same statistics (``tricks_lib.stats``). With ``replicates``, the workers are started
afresh for each stretch of rounds: state drawn once per process (memory layout, thread placement) then
gets several draws.

- ``compare_environments(setup, stmt, environments, baseline=...)`` -> ``Comparison``.

The worker processes and ``evaluate_in_environments`` are in ``env_workers``; the allocators to
compare (``allocator_environments``, ``loaded_allocators``) in ``allocators``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import textwrap
from collections.abc import Mapping

import torch

from tricks_lib._validate import check_positive
from tricks_lib.env import pick_device
from tricks_lib.inference.env_workers import _check_environments, _start, _Worker
from tricks_lib.measurements import Comparison, Measurement, paired_row
from tricks_lib.progress import optional_progress_bar as _progress_bar
from tricks_lib.stats import DEFAULT_MIN_EFFECT, MIN_ROUNDS_FOR_VERDICT

__all__ = ["EnvironmentComparison", "compare_environments"]


@dataclasses.dataclass(frozen=True, repr=False)  # keep Comparison's table repr
class EnvironmentComparison(Comparison):
    """A ``Comparison`` of worker processes, whose caption gives each worker's thread count.

    ``Comparison``'s caption names one thread count (the baseline's); here the workers may differ
    (a thread sweep), and the caption says so.
    """

    thread_counts: tuple[int, ...] = ()  # each row's worker's intra-op threads, in row order

    def _caption(self) -> str:
        counts = sorted(set(self.thread_counts)) or [self.num_threads]
        if len(counts) == 1:
            threads = f"{counts[0]} thread{'s' if counts[0] != 1 else ''} per worker"
        else:
            threads = f"{'/'.join(map(str, counts))} threads per worker (one count per row)"
        caption = super()._caption()
        generic = f" on {self.device}, {self.num_threads} thread{'s' if self.num_threads != 1 else ''};"
        return caption.replace(generic, f" in one worker process per row on {self.device}, {threads};", 1)


def _calibrate(worker: _Worker, target_block: float) -> int:
    number = 1
    while True:
        elapsed = float(worker.ask(str(number)))
        if elapsed >= target_block or number >= 1 << 24:
            return number
        number = max(number + 1, int(number * min(target_block / max(elapsed, 1e-9) * 1.1, 10.0)))


def _check_compare_arguments(
    setup: object,
    stmt: object,
    environments: object,
    baseline: str,
    *,
    rounds: object,
    replicates: object,
    block_seconds: object,
    threads: object,
    items: object,
    progress: object,
) -> dict[str, dict[str, str | None]]:
    """``compare_environments``'s checks, in its order; the environments as plain dicts."""
    if not isinstance(setup, str) or not isinstance(stmt, str) or not stmt.strip():
        raise TypeError("setup and stmt must be Python source strings (stmt not empty)")
    envs = _check_environments(environments, baseline)
    check_positive(rounds, "rounds", allow_none=False, integer=True)
    check_positive(replicates, "replicates", allow_none=False, integer=True)
    if rounds < MIN_ROUNDS_FOR_VERDICT or rounds < replicates:
        raise ValueError(f"rounds must be at least {MIN_ROUNDS_FOR_VERDICT} and at least replicates, got {rounds}")
    check_positive(block_seconds, "block_seconds", allow_none=False)
    check_positive(threads, "threads", integer=True)
    check_positive(items, "items", integer=True)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    return envs


@dataclasses.dataclass(frozen=True)
class _Timings:
    """What the rounds gave: per environment its per-call seconds, calls per block and workers' threads."""

    times: dict[str, list[float]]  # one entry per round, in round order
    numbers: dict[str, int]  # calls per timed block, calibrated in the first replicate
    threads: dict[str, int]  # the last replicate's workers' intra-op threads
    per_replicate: list[int]  # rounds each replicate ran


def _interleaved_rounds(
    workers: Mapping[str, _Worker], count: int, numbers: Mapping[str, int], rng: random.Random, times, bar
) -> None:
    """``count`` rounds, each asking every worker for one block in an order shuffled per round; seconds per call."""
    names = list(times)
    for _ in range(count):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            times[name].append(float(workers[name].ask(str(numbers[name]))) / numbers[name])
        if bar is not None:
            bar.update(1)


def _time_rounds(
    envs: dict[str, dict[str, str | None]],
    spec: dict,
    *,
    rounds: int,
    replicates: int,
    block_seconds: float,
    order_seed: int,
    timeout: float,
    progress: bool,
) -> _Timings:
    """Start the workers afresh per replicate and split the ``rounds`` evenly over the replicates."""
    rng = random.Random(order_seed)
    names = list(envs)
    times: dict[str, list[float]] = {name: [] for name in names}
    numbers: dict[str, int] | None = None
    per_replicate, worker_threads = [], {}
    bar = _progress_bar(progress, rounds, f"comparing {len(names)} environments")
    for replicate in range(replicates):
        workers = _start(envs, spec, timeout)
        try:
            if numbers is None:
                numbers = {name: _calibrate(w, block_seconds) for name, w in workers.items()}
            worker_threads = {name: int(json.loads(w.ask("threads"))) for name, w in workers.items()}
            count = rounds // replicates + (1 if replicate < rounds % replicates else 0)
            _interleaved_rounds(workers, count, numbers, rng, times, bar)
            per_replicate.append(count)
        finally:
            for worker in workers.values():
                worker.close()
    if bar is not None:
        bar.close()
    return _Timings(times=times, numbers=numbers, threads=worker_threads, per_replicate=per_replicate)


def _environment_comparison(
    timings: _Timings,
    *,
    baseline: str,
    device: str,
    replicates: int,
    items: int | None,
    min_effect: float,
    label: str | None,
) -> EnvironmentComparison:
    """One paired row per environment against ``baseline``, from the rounds' per-call seconds."""
    names = list(timings.times)
    replicate_rounds = tuple(timings.per_replicate) if replicates > 1 else ()
    measurements = {
        name: Measurement(
            label=name,
            times=tuple(timings.times[name]),
            number_per_block=timings.numbers[name],
            device=device,
            num_threads=timings.threads[name],
            items=items,
        )
        for name in names
    }
    rows = [
        paired_row(m, measurements[baseline], min_effect=min_effect, replicate_rounds=replicate_rounds)
        for m in measurements.values()
    ]
    return EnvironmentComparison(
        label=label or f"environments vs {baseline}",
        baseline=baseline,
        rows=tuple(rows),
        rounds=sum(timings.per_replicate),
        device=device,
        num_threads=timings.threads[baseline],
        min_effect=min_effect,
        replicate_rounds=replicate_rounds,
        thread_counts=tuple(timings.threads[name] for name in names),
    )


def compare_environments(
    setup: str,
    stmt: str,
    environments: Mapping[str, Mapping[str, str | None]],
    *,
    baseline: str,
    rounds: int = 15,
    block_seconds: float = 0.02,
    replicates: int = 1,
    threads: int | None = None,
    device: str | torch.device | None = "cpu",
    warmup: int = 1,
    items: int | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    label: str | None = None,
    order_seed: int = 0,
    timeout: float = 600.0,
    progress: bool = False,
) -> Comparison:
    """Time ``stmt`` in one worker process per environment, interleaved round by round.

    Args:
        setup: self-contained source run once per worker (imports, model, inputs); ``ENV_NAME`` and
            ``preloaded(name)`` are predefined. It cannot see the caller's variables.
        stmt: source of the work timed, run ``number`` times per block.
        environments: name -> {variable: value, or None to unset it}, applied on top of this
            process's environment, e.g. ``{"glibc": {}, "jemalloc": {"LD_PRELOAD": path}}``.
        baseline: the environment the others are read against.
        rounds: interleaved rounds in all (at least 8), split evenly over the replicates.
        block_seconds: about how long one timed block takes (calls per block calibrated per environment).
        replicates: sets of workers started afresh, each running ``rounds / replicates`` rounds.
        threads: ``torch.set_num_threads`` in each worker; None leaves the default (what
            ``OMP_NUM_THREADS`` says), so thread settings under test take effect.
        device: synchronized around each block when CUDA.
        warmup: untimed runs of ``stmt`` after setup.
        items / min_effect / label / order_seed: as in ``compare``.
        timeout: seconds a worker may take to exit.
        progress: show a progress bar over the rounds (off by default, and under ``TRICKS_PROGRESS=0``).

    Returns:
        An ``EnvironmentComparison`` (a ``Comparison``: one row per environment; its caption gives the
        workers' thread counts).

    Raises:
        TypeError / ValueError: malformed environments, an unknown baseline, too few rounds, bad sizes.
        RuntimeError: a worker failed (the message ends with its error).
    """
    envs = _check_compare_arguments(
        setup, stmt, environments, baseline, rounds=rounds, replicates=replicates, block_seconds=block_seconds,
        threads=threads, items=items, progress=progress,
    )  # fmt: skip
    dev = pick_device(device) if device is not None else pick_device()
    spec = {
        "setup": textwrap.dedent(setup),
        "stmt": textwrap.dedent(stmt),
        "threads": threads,
        "device": str(dev),
        "warmup": warmup,
    }
    timings = _time_rounds(
        envs, spec, rounds=rounds, replicates=replicates, block_seconds=block_seconds, order_seed=order_seed,
        timeout=timeout, progress=progress,
    )  # fmt: skip
    return _environment_comparison(
        timings, baseline=baseline, device=str(dev), replicates=replicates, items=items, min_effect=min_effect,
        label=label,
    )  # fmt: skip
