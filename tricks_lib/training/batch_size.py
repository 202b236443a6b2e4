"""The largest batch that fits a memory budget, found by probing.

``largest_batch(make_step)`` runs one step at growing batch sizes (1, 2, 4, ... doubling until a step
does not fit), then bisects between the last batch that fit and the first that did not. What "fits"
means depends on the device:

- On CUDA, against real allocation: a step fits when it runs without ``torch.cuda.OutOfMemoryError``
  and, if ``budget_bytes`` is given, when ``torch.cuda.max_memory_allocated`` stayed within it. After
  every probe the step's tensors are released and the caching allocator is emptied, so a failed
  probe does not leave memory behind for the next one.
- On the CPU (or MPS), against a stated budget: a step fits when the bytes it saves for backward
  (at most alive at once, ``tricks_lib.memory.measure_memory``, exact on any device) stay within ``budget_bytes``. Activation
  memory is what grows with the batch; parameters, gradients and optimizer state do not, so give
  the budget that is left once those are paid for.

The search assumes that memory does not shrink when the batch grows (true of every ordinary step).
"""

from __future__ import annotations

import gc
import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from tricks_lib._validate import check_positive
from tricks_lib.env import pick_device
from tricks_lib.formatting import format_bytes
from tricks_lib.memory import measure_memory
from tricks_lib.outcome import SummaryRow

__all__ = ["BatchProbe", "BatchSearch", "largest_batch"]

# Doubling stops here when no ``high`` is given: a step whose memory does not grow with the batch
# would otherwise be probed forever.
DEFAULT_HIGH = 1 << 20


@dataclass(frozen=True)
class BatchProbe:
    """One step tried at one batch size."""

    batch_size: int
    fits: bool
    used_bytes: int | None  # CPU: saved for backward; CUDA: peak allocated. None after an OOM.
    out_of_memory: bool = False  # CUDA: the step raised torch.cuda.OutOfMemoryError

    def __repr__(self) -> str:
        used = "out of memory" if self.out_of_memory else format_bytes(self.used_bytes)
        return f"BatchProbe({self.batch_size}: {'fits' if self.fits else 'too big'}, {used})"


@dataclass(frozen=True)
class BatchSearch:
    """The result of ``largest_batch``: the batch found and every probe tried, in order."""

    record_kind: ClassVar[str] = "batch search"  # the kind ``record()`` files it under

    batch_size: int  # the largest batch in [low, high] that fits
    budget_bytes: int | None  # None on CUDA without a budget: the device's capacity decides
    device: str
    criterion: str  # what was compared with the budget: "saved for backward" or "CUDA peak allocated"
    low: int
    high: int  # the upper limit searched (``high``, or DEFAULT_HIGH when none was given)
    probes: tuple[BatchProbe, ...]

    @property
    def reached_high(self) -> bool:
        """True when the upper limit itself fit: the real ceiling may lie above it."""
        return self.batch_size == self.high

    @property
    def used_bytes(self) -> int | None:
        """Memory the found batch used (the same measure as the budget)."""
        for probe in self.probes:
            if probe.batch_size == self.batch_size and probe.fits:
                return probe.used_bytes
        return None

    def __repr__(self) -> str:
        budget = format_bytes(self.budget_bytes) if self.budget_bytes is not None else "device capacity"
        limit = f", reached the limit {self.high}" if self.reached_high else ""
        return (
            f"BatchSearch(largest batch {self.batch_size} on {self.device}: {self.criterion} "
            f"{format_bytes(self.used_bytes)} within {budget}; {len(self.probes)} probes{limit})"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{p.batch_size}</td><td>{'fits' if p.fits else 'too big'}</td>"
            f"<td>{'out of memory' if p.out_of_memory else html.escape(format_bytes(p.used_bytes))}</td></tr>"
            for p in self.probes
        )
        return (
            f"<p><code>{html.escape(repr(self))}</code></p>"
            f"<table><tr><th>batch</th><th>result</th><th>{html.escape(self.criterion)}</th></tr>{rows}</table>"
        )

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        budget = format_bytes(self.budget_bytes) if self.budget_bytes is not None else "the device's capacity"
        limit = f"; the limit {self.high} fit, the real ceiling may be higher" if self.reached_high else ""
        used = self.used_bytes
        return (
            SummaryRow(
                variant=f"largest batch that fits ({self.criterion})",
                device=self.device,
                verdict=f"batch {self.batch_size} within {budget}{limit}",
                saved_bytes=used if self.criterion == "saved for backward" else None,
                peak_allocated_bytes=used if self.criterion != "saved for backward" else None,
            ),
        )

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "budget_bytes": self.budget_bytes,
            "device": self.device,
            "criterion": self.criterion,
            "low": self.low,
            "high": self.high,
            "probes": [
                {
                    "batch_size": p.batch_size,
                    "fits": p.fits,
                    "used_bytes": p.used_bytes,
                    "out_of_memory": p.out_of_memory,
                }
                for p in self.probes
            ],
        }


def _check_batch(value: object, name: str) -> None:
    check_positive(value, name, allow_none=False, integer=True)


def _probe_saved(make_step: Callable[[int], Callable[[], object]], batch: int, budget: int, device) -> BatchProbe:
    step = make_step(batch)
    if not callable(step):
        raise TypeError(f"make_step({batch}) must return a zero-argument callable, got {type(step).__name__}")
    used = measure_memory(
        step, label=f"batch {batch}", device=device
    ).peak_saved_bytes  # at most alive at once: right for multi-pass steps too
    return BatchProbe(batch_size=batch, fits=used <= budget, used_bytes=used)


def _release_cuda(device: torch.device) -> None:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _probe_cuda(
    make_step: Callable[[int], Callable[[], object]], batch: int, budget: int | None, device: torch.device
) -> BatchProbe:
    _release_cuda(device)
    torch.cuda.reset_peak_memory_stats(device)
    out_of_memory = False
    step = None
    try:
        step = make_step(batch)
        if not callable(step):
            raise TypeError(f"make_step({batch}) must return a zero-argument callable, got {type(step).__name__}")
        step()
        torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        # Do not release inside the handler: the traceback still references the failed step's frames
        # (and their tensors) until the handler ends.
        out_of_memory = True
    step = None  # drop the step's closure (inputs, outputs) before the next probe
    if out_of_memory:
        _release_cuda(device)
        return BatchProbe(batch_size=batch, fits=False, used_bytes=None, out_of_memory=True)
    used = torch.cuda.max_memory_allocated(device)
    _release_cuda(device)
    return BatchProbe(batch_size=batch, fits=budget is None or used <= budget, used_bytes=used)


def largest_batch(
    make_step: Callable[[int], Callable[[], object]],
    *,
    budget_bytes: int | None = None,
    device: str | torch.device | None = None,
    low: int = 1,
    high: int | None = None,
) -> BatchSearch:
    """Find the largest batch size whose step fits a memory budget.

    Batch sizes ``low, 2*low, 4*low, ...`` are probed until one does not fit (or ``high`` is
    reached), then the gap between the last fit and the first failure is bisected: about
    ``2 * log2(answer / low)`` probes in all. Each probe calls ``make_step(b)`` to build a step and
    runs that step once.

    Args:
        make_step: ``make_step(b)`` returns a zero-argument callable that runs one step at batch
            size ``b`` (e.g. creates a batch, runs forward and backward). Build the inputs inside it,
            so a failed CUDA probe frees them.
        budget_bytes: CPU/MPS: required; the most bytes the step may save for backward. CUDA:
            optional; the most ``torch.cuda.max_memory_allocated`` may reach during the step
            (everything allocated: model, optimizer state, activations). Without it the device's
            capacity decides (a step fits when it does not run out of memory).
        device: where the step runs (default ``pick_device()``); the step itself must use it.
        low: the smallest batch tried; it must fit.
        high: the largest batch tried (default: no limit but ``DEFAULT_HIGH``).

    Returns:
        A frozen ``BatchSearch`` with ``batch_size`` (the largest batch in ``[low, high]`` that fits,
        assuming memory grows with the batch) and ``probes`` (every batch tried, in order).

    Raises:
        TypeError: ``make_step`` is not callable or does not return a callable; a size is not an int.
        ValueError: no budget on a device without CUDA; a non-positive budget; ``high < low``;
            batch ``low`` itself does not fit (lower ``low`` or raise the budget); on a CPU, a step
            that saves nothing for backward at any size (the budget could never bound it).
    """
    if not callable(make_step):
        raise TypeError(f"make_step must be a callable taking a batch size, got {type(make_step).__name__}")
    _check_batch(low, "low")
    if high is not None:
        _check_batch(high, "high")
        if high < low:
            raise ValueError(f"high ({high}) must be at least low ({low})")
    limit = high if high is not None else max(DEFAULT_HIGH, low)
    if budget_bytes is not None:
        check_positive(budget_bytes, "budget_bytes", allow_none=False, integer=True)
    dev = pick_device(device) if device is not None else pick_device()
    cuda = dev.type == "cuda"
    if not cuda and budget_bytes is None:
        raise ValueError(
            f"on {dev.type} pass budget_bytes: the search compares the bytes the step saves for backward "
            "(tricks_lib.memory.measure_memory) with it, e.g. budget_bytes=64 * 2**20"
        )

    probes: list[BatchProbe] = []

    def fits(batch: int) -> bool:
        if cuda:
            probe = _probe_cuda(make_step, batch, budget_bytes, dev)
        else:
            probe = _probe_saved(make_step, batch, budget_bytes, dev)
        probes.append(probe)
        return probe.fits

    if not fits(low):
        raise ValueError(f"batch size {low} (low) already does not fit: {probes[0]!r}; lower low or raise budget_bytes")
    # Doubling: good is the largest batch known to fit, bad the smallest known not to (None: none yet).
    good, bad = low, None
    while good < limit:
        candidate = min(good * 2, limit)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
            break
    if not cuda and all(p.used_bytes == 0 for p in probes):
        raise ValueError(
            f"the step saved nothing for backward at any batch size up to {good} (it ran under no_grad or "
            "inference_mode, or used no autograd op), so a budget on saved bytes cannot bound it: make_step "
            "must return a step that runs forward with gradients, as training does"
        )
    # Bisection: the answer lies in [good, bad).
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
    return BatchSearch(
        batch_size=good,
        budget_bytes=budget_bytes,
        device=str(dev),
        criterion="CUDA peak allocated" if cuda else "saved for backward",
        low=low,
        high=limit,
        probes=tuple(probes),
    )
