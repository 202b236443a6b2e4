"""Where a training step's time goes: waiting for data vs computing, and a deliberately slow workload.

- ``next_batch(iterator, index, needed)``: the loader's next batch, or a ValueError that says the loader ran
  out (``phase_split`` reads its batches with it).
- ``PixelJitterDataset``: images with per-pixel Gaussian jitter, computed either in a Python loop
  over the pixels (the slow per-sample augmentation profilers should find) or as one tensor op.
- ``read_jitter_forever()``: the workload to sample from outside: says "ready", then reads the
  slow ``PixelJitterDataset`` until killed (``py_spy_sample()`` runs it by default: ``JITTER_SCRIPT``).
- ``py_spy_sample(script=JITTER_SCRIPT, seconds=1)``: py-spy's ``dump`` and ``record`` on a subprocess running
  ``script``; a ``PySpySample`` with the stack dump and the most sampled functions, or the reason it
  failed (not installed, no ptrace permission, a timeout), never a hang.
- ``plot_trace`` (from ``tricks_lib.profiling.trace``): the timeline of an exported profiler trace.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

import torch

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive

__all__ = [
    "JITTER_SCRIPT",
    "PixelJitterDataset",
    "PySpySample",
    "next_batch",
    "py_spy_sample",
    "read_jitter_forever",
    "without_local_paths",
]


def next_batch(iterator, index: int, needed: int):
    """The loader's next batch; a loader that runs out before ``needed`` batches is a ValueError."""
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError(
            f"the loader yielded {index} batches, but warmup + steps = {needed} are needed: "
            "use a longer loader or fewer steps"
        ) from None


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
    script: str = JITTER_SCRIPT, *, seconds: int = 1, rate: int = 200, top: int = 4, timeout: float = 60.0
) -> PySpySample:
    """Run ``script`` in a subprocess, then ``py-spy dump`` and ``py-spy record`` on it; kill it after.

    ``script`` must print a line (e.g. ``print("ready", flush=True)``) once it is in the code to
    sample, then keep running: sampling starts when that line arrives. Every wait has a time limit,
    so a py-spy that cannot attach or a script that never gets ready ends in a failed result, not a hang.

    Args:
        script: Python source for ``python -c`` (default: ``JITTER_SCRIPT``, the slow ``PixelJitterDataset`` read in
            a loop by ``read_jitter_forever``).
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
