"""Where a training step's time goes: waiting for data vs computing, and a deliberately slow workload.

- ``step_split(loader, step, steps=20)`` runs ``step(batch)`` over a loader and returns a
  ``StepSplit``: seconds spent waiting for the next batch, in the step (device synchronized after
  each one), and in total. A loop that mostly waits is loader-bound (workers, prefetching, cheaper
  transforms help); one that mostly computes is compute-bound (the model-side tricks help).
- ``PixelJitterDataset``: images with per-pixel Gaussian jitter, computed either in a Python loop
  over the pixels (the slow per-sample augmentation profilers should find) or as one tensor op.
- ``plot_trace`` (from ``tricks_lib.trace``): the timeline of an exported profiler trace.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.env import pick_device
from tricks_lib.formatting import format_seconds, html_table, markdown_table
from tricks_lib.summary import SummaryRow
from tricks_lib.timing import _synced_timer
from tricks_lib.trace import plot_trace

__all__ = ["PixelJitterDataset", "StepSplit", "plot_trace", "step_split"]


@dataclass(frozen=True)
class StepSplit:
    """How the timed steps of a loop split into waiting for the next batch and running the step.

    ``wait_times[i]`` is the time ``next()`` on the loader's iterator took before step ``i``;
    ``step_times[i]`` the time ``step(batch)`` took, the device synchronized after it. ``total_s``
    is the wall time of all timed steps, so ``other_s`` is the loop's own overhead (clock reads).
    """

    record_kind: ClassVar[str] = "step split"  # the kind ``record()`` files it under

    label: str
    wait_times: tuple[float, ...]
    step_times: tuple[float, ...]
    total_s: float
    device: str

    def __post_init__(self) -> None:
        if not self.wait_times or len(self.wait_times) != len(self.step_times):
            raise ValueError("a StepSplit needs one wait time and one step time per timed step")
        if any(t < 0 for t in (*self.wait_times, *self.step_times)) or self.total_s <= 0:
            raise ValueError("times must be non-negative and the total positive")

    @property
    def steps(self) -> int:
        return len(self.step_times)

    @property
    def wait_s(self) -> float:
        """Seconds waiting for batches, over all timed steps."""
        return sum(self.wait_times)

    @property
    def step_s(self) -> float:
        """Seconds inside ``step(batch)``, over all timed steps."""
        return sum(self.step_times)

    @property
    def other_s(self) -> float:
        """Seconds of the loop that were neither (its own overhead); never negative."""
        return max(0.0, self.total_s - self.wait_s - self.step_s)

    @property
    def wait_share(self) -> float:
        """Fraction of the loop's wall time spent waiting for the next batch."""
        return self.wait_s / self.total_s

    @property
    def step_share(self) -> float:
        """Fraction of the loop's wall time spent in the step."""
        return self.step_s / self.total_s

    @property
    def bound(self) -> str:
        """``"loader-bound"`` when the loop waited longer than it computed, else ``"compute-bound"``."""
        return "loader-bound" if self.wait_s > self.step_s else "compute-bound"

    def _rows(self) -> list[tuple[str, float, float | None, float]]:
        # (what, seconds in all, median per step, share of the loop)
        return [
            ("waiting for the next batch", self.wait_s, statistics.median(self.wait_times), self.wait_share),
            ("in the step (synchronized)", self.step_s, statistics.median(self.step_times), self.step_share),
            ("loop overhead", self.other_s, None, self.other_s / self.total_s),
            ("total", self.total_s, self.total_s / self.steps, 1.0),
        ]

    def _table(self) -> tuple[list[str], list[list[str]], str]:
        header = ["", "seconds in all", "per step (median)", "share"]
        body = [
            [what, format_seconds(s), "-" if m is None else format_seconds(m), f"{share:.1%}"]
            for what, s, m, share in self._rows()
        ]
        return header, body, f"{self.label}: {self.steps} steps on {self.device}, {self.bound}"

    def _repr_markdown_(self) -> str:
        return markdown_table(*self._table())

    def _repr_html_(self) -> str:
        return html_table(*self._table())

    def __repr__(self) -> str:
        return (
            f"StepSplit({self.label!r}: {self.steps} steps, {self.wait_share:.0%} waiting for the next batch, "
            f"{self.step_share:.0%} in the step, total {format_seconds(self.total_s)}, {self.device}, {self.bound})"
        )

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        return tuple(
            SummaryRow(
                variant=f"{self.label}: {what}",
                device=self.device,
                median_s=median if median is not None else seconds / self.steps,
                verdict=f"{share:.0%} of the loop",
            )
            for what, seconds, median, share in self._rows()
            if what != "loop overhead"
        )

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "steps": self.steps,
            "wait_s": self.wait_s,
            "step_s": self.step_s,
            "total_s": self.total_s,
            "wait_share": self.wait_share,
            "step_share": self.step_share,
            "bound": self.bound,
            "device": self.device,
        }


def step_split(
    loader: Iterable,
    step: Callable[[object], object],
    *,
    steps: int,
    device: str | torch.device | None = None,
    warmup: int = 1,
    label: str = "training loop",
) -> StepSplit:
    """Run ``warmup + steps`` iterations of ``step(batch)`` over ``loader``; time the last ``steps``.

    For each timed step: the seconds ``next()`` took to hand over the batch (the loader's work, or
    the wait for a worker), then the seconds of ``step(batch)`` with ``device`` synchronized after it,
    so queued GPU work is billed to the step and not to the next wait. One iterator is used for all
    steps, so worker start-up (in ``iter(loader)``) and warm-up steps are not counted.

    Args:
        loader: any iterable of batches (a DataLoader); it must yield at least ``warmup + steps``.
        step: called with each batch.
        steps: timed steps.
        device: whose queue is synchronized after each step (default: ``pick_device()``).
        warmup: untimed steps first (first-call allocations, a worker's first batch).
        label: a name for the result.

    Returns:
        A frozen ``StepSplit``.

    Raises:
        TypeError: ``loader`` is not iterable, ``step`` is not callable, a count is not a whole number.
        ValueError: a non-positive ``steps``, a negative ``warmup``, or a loader that ran out early.
    """
    if not isinstance(loader, Iterable):
        raise TypeError(f"loader must be an iterable of batches (e.g. a DataLoader), got {type(loader).__name__}")
    if not callable(step):
        raise TypeError(f"step must be a callable taking one batch, got {type(step).__name__}")
    check_positive(steps, "steps", allow_none=False, integer=True)
    check_non_negative_int(warmup, "warmup")
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a non-empty string, got {label!r}")
    dev = pick_device(device) if device is not None else pick_device()
    clock = _synced_timer(dev)
    now = timeit.default_timer  # a wait involves no device work, so its end needs no sync
    iterator = iter(loader)
    waits, times = [], []
    start = clock()
    for i in range(warmup + steps):
        if i == warmup:
            start = clock()
        before = now()
        try:
            batch = next(iterator)
        except StopIteration:
            raise ValueError(
                f"the loader yielded {i} batches, but warmup + steps = {warmup + steps} are needed: "
                "use a longer loader or fewer steps"
            ) from None
        handed_over = now()
        step(batch)
        done = clock()
        if i >= warmup:
            waits.append(handed_over - before)
            times.append(done - handed_over)
    total = clock() - start
    return StepSplit(label=label, wait_times=tuple(waits), step_times=tuple(times), total_s=total, device=str(dev))


def _clamp_pixel(value: float) -> float:
    # One Python call per pixel: the cost a per-sample Python loop pays, and what cProfile counts.
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class PixelJitterDataset(torch.utils.data.Dataset):
    """Images plus per-pixel Gaussian jitter, clamped to [0, 1]: a per-sample augmentation.

    Sample ``i``'s noise comes from a generator seeded with ``seed + i``, so both ways of computing
    it give the same sample (up to float32 rounding) in any process or worker.

    Args:
        images: (N, C, H, W) float tensor in [0, 1].
        labels: (N,) tensor.
        std: the jitter's standard deviation.
        seed: base seed of the per-sample noise.
        python_loop: True: add and clamp pixel by pixel in Python (deliberately slow, what a
            profiler should find); False: one tensor op per sample.

    Raises:
        TypeError / ValueError: tensors of the wrong kind or lengths, a non-positive ``std``.
    """

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, *, std: float = 0.05, seed: int = 0, python_loop: bool = True
    ) -> None:
        if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() != 4:
            raise TypeError("images must be a float tensor of shape (N, C, H, W)")
        if not isinstance(labels, torch.Tensor) or labels.shape[:1] != images.shape[:1]:
            raise ValueError(f"labels must be a tensor with one entry per image ({images.shape[0]})")
        check_positive(std, "std", allow_none=False)
        check_non_negative_int(seed, "seed")
        check_flag(python_loop, "python_loop")
        self.images, self.labels, self.std, self.seed, self.python_loop = images, labels, float(std), seed, python_loop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]  # (C, H, W)
        noise = torch.randn(image.shape, generator=torch.Generator().manual_seed(self.seed + index)) * self.std
        if self.python_loop:
            pixels = [_clamp_pixel(v + n) for v, n in zip(image.flatten().tolist(), noise.flatten().tolist())]
            jittered = torch.tensor(pixels, dtype=image.dtype).view(image.shape)
        else:
            jittered = (image + noise).clamp_(0.0, 1.0)
        return jittered, self.labels[index]
