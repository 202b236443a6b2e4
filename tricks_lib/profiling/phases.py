"""Where each phase of a training step's time goes, read from two clocks that must agree.

- ``phase_split(loader, phases, steps=20)`` runs a training loop and returns a ``PhaseSplit``: the
  seconds of each phase of every step (waiting for the batch, then the phases the step marks:
  host-to-device copy, forward, backward, optimizer, ...), measured twice in the same run: by
  ``time.perf_counter`` around each phase (on CUDA, the device synchronized before each read), and by
  ``torch.profiler`` from the ``record_function`` range each phase also runs in. The result carries
  both readings and how far they disagree, so a notebook can assert that they agree.

The phases are given either as an ordered mapping ``name -> callable``, each called with what the
previous one returned (the first with the batch), or as a step function ``step(batch, phase)`` that
marks its own phases with ``with phase("forward"): ...``. How a fix moved the split (``phase_shift``)
is in ``phase_shifts``.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.env import pick_device
from tricks_lib.formatting import format_seconds, html_table, markdown_table
from tricks_lib.outcome import SummaryRow
from tricks_lib.profiling.profiler import next_batch
from tricks_lib.progress import optional_progress_bar as _progress_bar
from tricks_lib.timed_blocks import synced_timer as _synced_timer

__all__ = ["WAIT_PHASE", "PhaseSplit", "phase_split"]

WAIT_PHASE = "wait for batch"  # the phase phase_split adds itself: next() on the loader's iterator
_WINDOW = "phase_split: timed steps"  # the profiler range around the timed steps (warm-up left out)


def _share_table(values: Mapping[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {name: (v / total if total > 0 else 0.0) for name, v in values.items()}


@dataclass(frozen=True)
class PhaseSplit:
    """Each phase's seconds in every timed step of a loop, by the timers and by the profiler.

    ``phases[0]`` is ``WAIT_PHASE``; the rest are the step's phases in the order they first ran.
    ``timer_times[k][i]`` is phase ``k``'s seconds in timed step ``i`` by the timers (0 where a step
    skipped it); ``profiler_times[k][i]`` the same from its ``record_function`` ranges. Shares are
    of the phases' sum, so time outside every phase (the loop's clock reads, code between phases:
    ``unmarked_s``) is left out of both readings alike.
    """

    record_kind: ClassVar[str] = "phase split"  # the kind ``record()`` files it under

    label: str
    phases: tuple[str, ...]
    timer_times: tuple[tuple[float, ...], ...]
    profiler_times: tuple[tuple[float, ...], ...]
    total_s: float
    device: str
    items_per_step: int | None = None

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0] != WAIT_PHASE or len(set(self.phases)) != len(self.phases):
            raise ValueError(f"phases must be distinct names, starting with {WAIT_PHASE!r}")
        rows = (*self.timer_times, *self.profiler_times)
        if len(self.timer_times) != len(self.phases) or len(self.profiler_times) != len(self.phases):
            raise ValueError("a PhaseSplit needs one row of timer times and one of profiler times per phase")
        if not rows[0] or len({len(row) for row in rows}) != 1:
            raise ValueError("every phase needs one time per timed step by each reading, and at least one step")
        if any(t < 0 for row in rows for t in row) or self.total_s <= 0:
            raise ValueError("times must be non-negative and the total positive")

    @property
    def steps(self) -> int:
        return len(self.timer_times[0])

    @property
    def timer_s(self) -> dict[str, float]:
        """Seconds per phase over the timed steps, by the timers."""
        return {name: sum(row) for name, row in zip(self.phases, self.timer_times)}

    @property
    def profiler_s(self) -> dict[str, float]:
        """Seconds per phase over the timed steps, by the profiler's ranges."""
        return {name: sum(row) for name, row in zip(self.phases, self.profiler_times)}

    @property
    def timer_shares(self) -> dict[str, float]:
        """Each phase's fraction of all phases' time, by the timers."""
        return _share_table(self.timer_s)

    @property
    def profiler_shares(self) -> dict[str, float]:
        """Each phase's fraction of all phases' time, by the profiler."""
        return _share_table(self.profiler_s)

    @property
    def disagreements(self) -> dict[str, float]:
        """Per phase, over all timed steps: the timers' share minus the profiler's (0.01 is one point)."""
        profiler = self.profiler_shares
        return {name: share - profiler[name] for name, share in self.timer_shares.items()}

    @property
    def step_disagreements(self) -> tuple[float, ...]:
        """Per timed step: the largest difference between the two readings' shares of that step."""
        out = []
        for i in range(self.steps):
            timer = _share_table({n: row[i] for n, row in zip(self.phases, self.timer_times)})
            profiler = _share_table({n: row[i] for n, row in zip(self.phases, self.profiler_times)})
            out.append(max(abs(timer[n] - profiler[n]) for n in self.phases))
        return tuple(out)

    @property
    def disagreement(self) -> float:
        """How far the readings' shares differ in the median step (a fraction; 0.01 is one point).

        The median, because a step preempted in the microseconds between a range's edge and its clock
        read differs for that step only, while a timer that bills time to the wrong phase (a missed
        sync) differs in every step. ``worst_disagreement`` is the largest step's.
        """
        return statistics.median(self.step_disagreements)

    @property
    def worst_disagreement(self) -> float:
        return max(self.step_disagreements)

    @property
    def least_margin_s(self) -> float:
        """The smallest profiler-minus-timer seconds of any phase in any step.

        Each timer interval lies inside its profiler range, so this is never below zero by more than
        the two clocks' disagreement: a negative margin beyond that means the readings timed different work.
        """
        return min(p - t for prow, trow in zip(self.profiler_times, self.timer_times) for p, t in zip(prow, trow))

    @property
    def unmarked_s(self) -> float:
        """Seconds of the timed loop in no phase (clock reads, code between phases); never negative."""
        return max(0.0, self.total_s - sum(self.timer_s.values()))

    @property
    def wait_share(self) -> float:
        """The timers' share of waiting for the batch."""
        return self.timer_shares[WAIT_PHASE]

    @property
    def bound(self) -> str:
        """``"loader-bound"`` when the loop waited longer than all its step's phases took, else ``"compute-bound"``."""
        return "loader-bound" if self.wait_share > 0.5 else "compute-bound"

    @property
    def dominant(self) -> str:
        """The phase with the largest share (by the timers)."""
        shares = self.timer_shares
        return max(shares, key=shares.get)

    @property
    def step_s(self) -> float:
        """Wall seconds per timed step, everything included."""
        return self.total_s / self.steps

    @property
    def items_per_second(self) -> float | None:
        """Items (``items_per_step`` per step) per wall second; None when ``items_per_step`` is not given."""
        return None if self.items_per_step is None else self.items_per_step / self.step_s

    def _table(self) -> tuple[list[str], list[list[str]], str]:
        header = ["phase", "per step (median)", "in all (timers)", "share (timers)", "share (profiler)", "difference"]
        timer, profiler, diff = self.timer_shares, self.profiler_shares, self.disagreements
        body = [
            [name, format_seconds(statistics.median(row)), format_seconds(sum(row)), f"{timer[name]:.1%}",
             f"{profiler[name]:.1%}", f"{100 * diff[name]:+.2f} pt"]
            for name, row in zip(self.phases, self.timer_times)
        ]  # fmt: skip
        rate = "" if self.items_per_second is None else f", {self.items_per_second:,.0f} items/s"
        caption = (
            f"{self.label}: {self.steps} steps on {self.device}, {format_seconds(self.step_s)} per step{rate}, "
            f"{self.bound}; the readings' shares differ by {100 * self.disagreement:.2f} pt in the median step"
        )
        return header, body, caption

    def _repr_markdown_(self) -> str:
        return markdown_table(*self._table())

    def _repr_html_(self) -> str:
        return html_table(*self._table())

    def __repr__(self) -> str:
        shares = ", ".join(f"{name} {share:.0%}" for name, share in self.timer_shares.items())
        return (
            f"PhaseSplit({self.label!r}: {self.steps} steps, {shares}; {self.bound}, "
            f"timers vs profiler within {100 * self.disagreement:.2f} pt, {self.device})"
        )

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        profiler = self.profiler_shares
        return tuple(
            SummaryRow(
                variant=f"{self.label}: {name}",
                device=self.device,
                median_s=statistics.median(row),
                verdict=f"{share:.0%} of the step (profiler: {profiler[name]:.0%})",
                items_per_second=self.items_per_second,
            )
            for (name, share), row in zip(self.timer_shares.items(), self.timer_times)
        )

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "steps": self.steps,
            "device": self.device,
            "total_s": self.total_s,
            "timer_s": self.timer_s,
            "profiler_s": self.profiler_s,
            "timer_shares": self.timer_shares,
            "profiler_shares": self.profiler_shares,
            "disagreement": self.disagreement,
            "worst_disagreement": self.worst_disagreement,
            "bound": self.bound,
            "items_per_step": self.items_per_step,
        }


class _PhaseRecorder:
    """``phase(name)``: a context that times its block (device synced) inside ``record_function(name)``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._active: str | None = None
        self.order: list[str] = [WAIT_PHASE]
        self.current: dict[str, float] = {}  # this step's seconds per phase

    def add(self, name: str, seconds: float) -> None:
        if name not in self.order:
            self.order.append(name)
        self.current[name] = self.current.get(name, 0.0) + seconds

    @contextmanager
    def __call__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError(f"a phase's name must be a non-empty string, got {name!r}")
        if name in (WAIT_PHASE, _WINDOW):
            raise ValueError(f"{name!r} is the name phase_split gives its own range: name the phase otherwise")
        if self._active is not None:
            raise ValueError(f"phase {name!r} started inside phase {self._active!r}: phases cannot nest")
        self._active = name
        try:
            # The clock reads sit inside the range, so each timer interval lies within its profiler range.
            with torch.profiler.record_function(name):
                start = self._clock()  # synced: work queued before the phase is not billed to it
                yield
                self.add(name, self._clock() - start)
        finally:
            self._active = None


def _as_step(phases: object) -> Callable[[object, _PhaseRecorder], object]:
    if isinstance(phases, Mapping):
        if not phases:
            raise ValueError("phases must name at least one phase, e.g. {'forward': ..., 'backward': ...}")
        for name, fn in phases.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"each phase's name must be a non-empty string, got {name!r}")
            if not callable(fn):
                raise TypeError(f"phase {name!r} must be a callable taking the previous phase's result")

        def chained(batch: object, phase: _PhaseRecorder) -> object:
            value = batch
            for name, fn in phases.items():
                with phase(name):
                    value = fn(value)
            return value

        return chained
    if callable(phases):
        return phases
    raise TypeError(
        "phases must be a mapping name -> callable (each gets the previous one's result) "
        f"or a step function step(batch, phase), got {type(phases).__name__}"
    )


def _profiler_times(prof: torch.profiler.profile, names: list[str], steps: int) -> list[list[float]]:
    """Seconds of each name's host-side ranges per timed step; a step runs from its wait's start to the next's."""
    from torch.autograd import DeviceType

    host = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    window = next(e.time_range for e in host if e.name == _WINDOW)
    inside = sorted(
        (e for e in host if e.name in names and window.start <= e.time_range.start and e.time_range.end <= window.end),
        key=lambda e: e.time_range.start,
    )
    times = {name: [0.0] * steps for name in names}
    step = -1
    for e in inside:
        step += e.name == WAIT_PHASE  # every step begins with its one wait
        if 0 <= step < steps:
            times[e.name][step] += e.time_range.elapsed_us() * 1e-6
    if step != steps - 1:
        raise RuntimeError(f"the profiler kept {step + 1} waits for {steps} timed steps: were events dropped?")
    return [times[name] for name in names]


def phase_split(
    loader: Iterable,
    phases: Mapping[str, Callable[[object], object]] | Callable[[object, object], object],
    *,
    steps: int,
    device: str | torch.device | None = None,
    warmup: int = 1,
    label: str = "training loop",
    items_per_step: int | None = None,
    progress: bool = False,
) -> PhaseSplit:
    """Run ``warmup + steps`` steps over ``loader`` under ``torch.profiler``; time each phase two ways.

    Each step first waits for its batch (``next()`` on one iterator, the phase ``WAIT_PHASE``), then
    runs its phases. Every phase runs inside ``record_function(name)`` and, inside that range, between
    two reads of ``time.perf_counter`` (on CUDA each read first synchronizes the device, so a phase's
    queued kernels are billed to it). Both clocks watch the same run: the profiler's per-op overhead
    is in both readings alike, and they can differ only by the clock reads and the profiler's own
    bookkeeping, so a disagreement beyond a fraction of a percentage point means something billed
    time to the wrong phase. Without the profiler: ``compare``.

    Args:
        loader: any iterable of batches (a DataLoader); it must yield at least ``warmup + steps``.
        phases: either an ordered mapping ``name -> fn``, where the first ``fn`` gets the batch and
            each next one what the previous returned (e.g. ``{"copy": to_device, "forward": loss_of,
            "backward": lambda loss: loss.backward(), "optimizer": lambda _: opt.step()}``); or a step
            function ``step(batch, phase)`` that marks its phases with ``with phase("forward"): ...``
            (phases may not nest; a name used twice in a step adds up; time in no phase is ``unmarked_s``).
        steps: timed steps.
        device: whose queue is synchronized around each phase (default: ``pick_device()``).
        warmup: untimed steps first (first-call allocations, the profiler's start-up, a worker's first batch).
        label: a name for the result.
        items_per_step: items per batch, for ``items_per_second`` (optional).
        progress: show a progress bar over the steps (updated between steps, outside every phase;
            ``TRICKS_PROGRESS=0`` turns it off).

    Returns:
        A frozen ``PhaseSplit`` with both readings.

    Raises:
        TypeError: ``loader`` is not iterable, ``phases`` neither a mapping of callables nor a callable,
            a count is not a whole number, a phase name is not a non-empty string.
        ValueError: a non-positive ``steps``, a negative ``warmup``, an empty mapping, a loader that ran
            out early, nested phases or a phase named like phase_split's own ranges.
    """
    if not isinstance(loader, Iterable):
        raise TypeError(f"loader must be an iterable of batches (e.g. a DataLoader), got {type(loader).__name__}")
    step = _as_step(phases)
    check_positive(steps, "steps", allow_none=False, integer=True)
    check_non_negative_int(warmup, "warmup")
    check_positive(items_per_step, "items_per_step", integer=True)
    check_flag(progress, "progress")
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a non-empty string, got {label!r}")
    dev = pick_device(device) if device is not None else pick_device()
    clock, now = _synced_timer(dev), timeit.default_timer  # a wait involves no device work: no sync
    recorder = _PhaseRecorder(clock)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    per_step: list[dict[str, float]] = []
    iterator = iter(loader)
    with torch.profiler.profile(activities=activities) as prof, ExitStack() as timed:
        bar = _progress_bar(progress, warmup + steps, label)
        if bar is not None:
            timed.callback(bar.close)
        start = clock()
        for i in range(warmup + steps):
            if i == warmup:
                timed.enter_context(torch.profiler.record_function(_WINDOW))  # closed when the loop ends
                start = clock()
            recorder.current = {}
            with torch.profiler.record_function(WAIT_PHASE):
                before = now()
                batch = next_batch(iterator, i, warmup + steps)
                recorder.add(WAIT_PHASE, now() - before)
            step(batch, recorder)
            if i >= warmup:
                per_step.append(recorder.current)
            if bar is not None:
                bar.update()
        total = clock() - start
    names = recorder.order
    return PhaseSplit(
        label=label,
        phases=tuple(names),
        timer_times=tuple(tuple(s.get(name, 0.0) for s in per_step) for name in names),
        profiler_times=tuple(tuple(row) for row in _profiler_times(prof, names, steps)),
        total_s=total,
        device=str(dev),
        items_per_step=items_per_step,
    )
