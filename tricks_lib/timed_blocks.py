"""The timed block that ``measure`` and ``compare`` share: a device-synced clock, warm-up, one block.

A block is ``number`` back-to-back calls between two reads of a clock that first waits for the
device's queued work (``synced_timer``), so GPU kernels are fully counted. ``tricks_lib.timing``
(``measure``) and ``tricks_lib.comparing`` (``compare``) build their loops from these pieces;
``phases`` and ``profiling`` read the same clock.
"""

from __future__ import annotations

import logging
import timeit
from collections.abc import Callable

import torch

from tricks_lib.env import quick_mode

__all__ = ["Timer", "default_min_run_time", "make_timer", "run_block", "synced_timer", "warm_up"]


def _import_timer():
    # torch.utils.benchmark imports cpp_extension, which logs a CUDA_HOME warning on machines with a
    # CUDA toolkit but no GPU. Silence that one import without leaving the logger changed.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils.benchmark import Timer
    finally:
        logger.setLevel(level)
    return Timer


Timer = _import_timer()


def default_min_run_time() -> float:
    # Quick mode only has to show that the code runs; full mode gives stable medians.
    return 0.05 if quick_mode() else 0.5


def synced_timer(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for the device's queued work, so GPU kernels are fully counted."""
    if device.type == "cuda":

        def cuda_timer() -> float:
            torch.cuda.synchronize(device)
            return timeit.default_timer()

        return cuda_timer
    if device.type == "mps":

        def mps_timer() -> float:
            torch.mps.synchronize()
            return timeit.default_timer()

        return mps_timer
    return timeit.default_timer


def make_timer(
    fn: Callable[[], object], device: torch.device, label: str, clock: Callable[[], float] | None = None
) -> Timer:
    # num_threads: Timer defaults to 1 thread; keep the caller's setting so we time what they run.
    return Timer(
        stmt="fn()",
        globals={"fn": fn},
        timer=clock or synced_timer(device),
        num_threads=torch.get_num_threads(),
        label=label,
    )


def run_block(timer: Timer, number: int) -> float:
    """Seconds for ``number`` back-to-back calls, without Timer.timeit's extra warm-up calls."""
    from torch.utils.benchmark.utils import common

    with common.set_torch_threads(timer._task_spec.num_threads):
        return timer._timeit(number)


def warm_up(fn: Callable[[], object], device: torch.device, calls: int) -> None:
    for _ in range(calls):
        fn()
    clock = synced_timer(device)
    clock()  # drain queued device work so it is not billed to the first timed block
