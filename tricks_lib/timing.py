"""Timing done right: warm-up, device sync, repeats, median and spread; interleaved A/B comparisons.

Built on ``torch.utils.benchmark.Timer`` (it runs the timed loops and keeps torch's thread count
fixed); the timed block itself (synced clock, warm-up) lives in ``tricks_lib.timed_blocks``. Read
top to bottom:

- ``measure(fn)`` times one callable, like ``Timer.blocked_autorange``, with at least 3 blocks.
- ``time_first_call(fn)`` times one call on purpose: a first-call cost.
- ``compare({"A": a, "B": b}, baseline="A")`` lives in ``tricks_lib.comparing``: rounds of every
  variant in a shuffled order, read as "1.8x faster" or "not significant".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tricks_lib._validate import check_callable, check_flag, check_non_negative_int, check_positive
from tricks_lib.env import pick_device
from tricks_lib.measurements import Measurement
from tricks_lib.progress import optional_progress_bar
from tricks_lib.stats import MIN_BLOCKS_FOR_SPREAD
from tricks_lib.timed_blocks import default_min_run_time, make_timer, run_block, synced_timer, warm_up

__all__ = ["measure", "time_first_call"]


def measure(
    fn: Callable[[], object],
    *,
    label: str | None = None,
    items: int | None = None,
    min_run_time: float | None = None,
    device: str | torch.device | None = None,
    warmup: int = 1,
    min_blocks: int = MIN_BLOCKS_FOR_SPREAD,
    progress: bool = False,
    clock: Callable[[], float] | None = None,
) -> Measurement:
    """Time ``fn()``: warm-up calls, then ``Timer.blocked_autorange`` with the device synchronized.

    Args:
        fn: a zero-argument callable doing the work once.
        label: a name for the result (default: the callable's name).
        items: things processed per call (samples, images); gives ``items_per_second``.
        min_run_time: seconds of timed calls at least (default 0.05 in quick mode, 0.5 otherwise).
        device: whose queue is synchronized around each timed block (default: ``pick_device()``).
        warmup: untimed calls first (first-call costs: allocation, autotuning, lazy init).
        min_blocks: timed blocks at least, even when one call outlasts ``min_run_time`` (default 3, the
            fewest with a meaningful IQR). With fewer, the result says it has no spread estimate.
        progress: show a progress bar over the timed blocks (tqdm.auto); off by default.
        clock: seconds as a float, read around each timed block (default: ``timeit.default_timer``
            after synchronizing ``device``). A custom clock must do its own device sync; tests pass a
            fake one that the workload advances, so the harness's arithmetic is checked exactly.

    Returns:
        A frozen ``Measurement``.

    Raises:
        TypeError / ValueError: a non-callable ``fn`` or a non-positive ``items``/``min_run_time``/``min_blocks``.
    """
    check_callable(fn, "fn")
    check_positive(items, "items", integer=True)
    check_positive(min_run_time, "min_run_time")
    check_non_negative_int(warmup, "warmup")
    check_positive(min_blocks, "min_blocks", allow_none=False, integer=True)
    check_flag(progress, "progress")
    if clock is not None:
        check_callable(clock, "clock")
    dev = pick_device(device) if device is not None else pick_device()
    name = label if label is not None else getattr(fn, "__name__", "fn")
    bar = optional_progress_bar(progress, None, f"measuring {name}")
    try:
        warm_up(fn, dev, warmup)
        timer = make_timer(fn, dev, name, clock)
        callback = (lambda number, elapsed: bar.update(1)) if bar is not None else None
        result = timer.blocked_autorange(callback=callback, min_run_time=min_run_time or default_min_run_time())
        number = int(result.number_per_run)
        times = [float(t) for t in result.times]
        # blocked_autorange stops after one block when a call outlasts min_run_time; its IQR would be 0
        # and the measurement would look perfectly quiet. Take the blocks a spread estimate needs.
        while len(times) < min_blocks:
            times.append(run_block(timer, number) / number)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return Measurement(
        label=name,
        times=tuple(times),
        number_per_block=number,
        device=str(dev),
        num_threads=torch.get_num_threads(),
        items=items,
    )


def time_first_call(fn: Callable[[], object], *, device: str | torch.device | None = None) -> float:
    """Seconds of one call of ``fn``, device synchronized before and after: a first-call cost, on purpose.

    Use it for what ``measure`` deliberately hides: lazy initialization, kernel autotuning,
    ``torch.compile``'s compilation. Only meaningful for a call that has not happened before.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    check_callable(fn, "fn")
    clock = synced_timer(pick_device(device) if device is not None else pick_device())
    start = clock()
    fn()
    return clock() - start
