"""Where a training step's time goes: waiting for data vs computing, and a deliberately slow workload.

- ``step_split(loader, step, steps=20)`` runs ``step(batch)`` over a loader and returns a
  ``StepSplit``: seconds spent waiting for the next batch, in the step (device synchronized after
  each one), and in total. A loop that mostly waits is loader-bound (workers, prefetching, cheaper
  transforms help); one that mostly computes is compute-bound (the model-side tricks help).
- ``PixelJitterDataset``: images with per-pixel Gaussian jitter, computed either in a Python loop
  over the pixels (the slow per-sample augmentation profilers should find) or as one tensor op.
- ``read_jitter_forever()``: the workload to sample from outside: says "ready", then reads the
  slow ``PixelJitterDataset`` until killed (``py_spy_sample(JITTER_SCRIPT)`` runs it).
- ``py_spy_sample(script, seconds=1)``: py-spy's ``dump`` and ``record`` on a subprocess running
  ``script``; a ``PySpySample`` with the stack dump and the most sampled functions, or the reason it
  failed (not installed, no ptrace permission, a timeout), never a hang.
- ``plot_trace`` (from ``tricks_lib.profiling.trace``): the timeline of an exported profiler trace.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import timeit
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.env import pick_device
from tricks_lib.formatting import format_seconds, html_table, markdown_table
from tricks_lib.outcome import SummaryRow
from tricks_lib.timed_blocks import synced_timer as _synced_timer

__all__ = [
    "JITTER_SCRIPT",
    "PixelJitterDataset",
    "PySpySample",
    "StepSplit",
    "next_batch",
    "py_spy_sample",
    "read_jitter_forever",
    "step_split",
    "without_local_paths",
]


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


def next_batch(iterator, index: int, needed: int):
    """The loader's next batch; a loader that runs out before ``needed`` batches is a ValueError."""
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError(
            f"the loader yielded {index} batches, but warmup + steps = {needed} are needed: "
            "use a longer loader or fewer steps"
        ) from None


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
        batch = next_batch(iterator, i, warmup + steps)
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


def read_jitter_forever(*, samples: int = 64, size: int = 16) -> None:
    """Print ``ready`` (flushed), then read a per-pixel ``PixelJitterDataset`` in a loop until killed.

    The workload a sampling profiler watches from outside: run it in a subprocess, e.g.
    ``py_spy_sample(JITTER_SCRIPT)``. The line is the ready signal ``py_spy_sample`` waits for.

    Args:
        samples: images in the dataset; size: their side (3 channels).

    Raises:
        TypeError / ValueError: a count that is not a positive whole number.
    """
    check_positive(samples, "samples", allow_none=False, integer=True)
    check_positive(size, "size", allow_none=False, integer=True)
    data = PixelJitterDataset(torch.rand(samples, 3, size, size), torch.zeros(samples))
    print("ready", flush=True)
    while True:
        for i in range(samples):
            data[i]


# Python source for py_spy_sample: the slow dataset read in a loop, in the subprocess.
JITTER_SCRIPT = "from tricks_lib.profiling.profiler import read_jitter_forever; read_jitter_forever()"


def without_local_paths(text: str) -> str:
    """``text`` with terminal colour codes removed and every absolute path cut to its last part.

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return re.sub(r"(?<![\w.+-])(?:/[\w.+-]+)+/([\w.+-]+)", r"\1", text)


_PTRACE_HINT = (
    "py-spy reads another process's memory: in a container it needs ptrace permission "
    "(docker run --cap-add SYS_PTRACE), and kernel.yama.ptrace_scope must allow it"
)


@dataclass(frozen=True)
class PySpySample:
    """What py-spy saw in a subprocess: its stack dump and the share of samples per innermost function.

    ``error`` is None when both ``py-spy dump`` and ``py-spy record`` worked; otherwise it says why
    not (and ``dump`` is empty, ``leaf_shares`` empty).
    """

    dump: str
    leaf_shares: dict[str, float]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def __repr__(self) -> str:
        if not self.ok:
            return f"PySpySample(failed: {self.error})"
        top = ", ".join(f"{name}: {share:.0%}" for name, share in self.leaf_shares.items())
        return f"PySpySample({top})"


def _failed(reason: str) -> PySpySample:
    return PySpySample(dump="", leaf_shares={}, error=reason)


def _py_spy_failure(command: str, result: subprocess.CompletedProcess, child: subprocess.Popen) -> PySpySample:
    """The first line of py-spy's message; the ptrace hint only where the message is about permission."""
    if child.poll() is not None:
        return _failed(
            f"py-spy {command} failed: the script to sample exited (status {child.returncode}) before it ended"
        )
    lines = without_local_paths(result.stderr or result.stdout).strip().splitlines()
    message = lines[0] if lines else f"exit status {result.returncode}, no message"
    permission = any(word in message.lower() for word in ("permission", "ptrace", "not permitted"))
    return _failed(f"py-spy {command} failed: {message}" + (f". {_PTRACE_HINT}" if permission else ""))


def py_spy_sample(
    script: str, *, seconds: int = 1, rate: int = 200, top: int = 4, timeout: float = 60.0
) -> PySpySample:
    """Run ``script`` in a subprocess, then ``py-spy dump`` and ``py-spy record`` on it; kill it after.

    ``script`` must print a line (e.g. ``print("ready", flush=True)``) once it is in the code to
    sample, then keep running: sampling starts when that line arrives. Every wait has a time limit,
    so a py-spy that cannot attach or a script that never gets ready ends in a failed result, not a hang.

    Args:
        script: Python source for ``python -c``.
        seconds: how long ``py-spy record`` samples (whole seconds: py-spy's ``--duration``).
        rate: samples per second.
        top: how many innermost functions to keep, most sampled first.
        timeout: seconds the script may take to get ready, and each py-spy call beyond ``seconds``.

    Returns:
        A ``PySpySample``: the dump (local folders cut from paths) and the ``top`` innermost
        functions (``"function (file)"``) with their share of the samples; or ``error`` set.

    Raises:
        TypeError / ValueError: a non-string or empty ``script``; non-positive ``seconds``,
        ``rate``, ``top`` or ``timeout``.
    """
    if not isinstance(script, str) or not script.strip():
        raise TypeError("script must be non-empty Python source for python -c")
    check_positive(seconds, "seconds", allow_none=False, integer=True)
    check_positive(rate, "rate", allow_none=False, integer=True)
    check_positive(top, "top", allow_none=False, integer=True)
    check_positive(timeout, "timeout", allow_none=False)
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return _failed("py-spy is not installed (pip install py-spy)")
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        ready = threading.Thread(target=child.stdout.readline, daemon=True)
        ready.start()
        ready.join(timeout)
        if ready.is_alive() or child.poll() is not None:
            return _failed(f"the script to sample did not get ready within {timeout:g} s (or exited)")
        with tempfile.TemporaryDirectory(prefix="py-spy-") as folder:
            raw = f"{folder}/samples.txt"
            dump = subprocess.run(
                [py_spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=timeout
            )
            if dump.returncode != 0:
                return _py_spy_failure("dump", dump, child)
            rec = subprocess.run(
                [py_spy, "record", "--pid", str(child.pid), "--duration", str(seconds), "--rate", str(rate),
                 "--format", "raw", "--output", raw],
                capture_output=True, text=True, timeout=seconds + timeout,
            )  # fmt: skip
            if rec.returncode != 0:
                return _py_spy_failure("record", rec, child)
            try:
                lines = open(raw, encoding="utf-8").read().splitlines()
            except OSError:
                lines = []
    except subprocess.TimeoutExpired as err:
        return _failed(f"py-spy did not finish within {err.timeout:g} s and was stopped")
    finally:
        child.kill()
        child.wait()
    leaves: dict[str, int] = {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # The innermost frame, "function (file:line)": lines of one function merged.
        leaf = re.sub(r":\d+\)$", ")", without_local_paths(stack.split(";")[-1]))
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
    total = sum(leaves.values())
    if total == 0:
        return _failed("py-spy record ran but wrote no samples")
    ranked = sorted(leaves.items(), key=lambda kv: -kv[1])[:top]
    return PySpySample(dump=without_local_paths(dump.stdout.strip()), leaf_shares={k: v / total for k, v in ranked})
