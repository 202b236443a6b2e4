"""DistributedDataParallel training from a notebook: ``launch_ddp`` runs torchrun and returns a ``DDPResult``.

``launch_ddp(...)`` runs ``python -m torch.distributed.run --nproc-per-node N -m
tricks_lib.training.ddp_worker --out result.json`` (the per-rank worker, module ``ddp_worker``: a
``SmallCNN`` trained with DDP from a different seed per rank, its gradient all-reduces counted)
through the caller's interpreter (``sys.executable``) on a free localhost port, with a timeout, and
returns the ``DDPResult`` rank 0 wrote: step times (median and IQR, like ``tricks_lib.measure``),
throughput, all-reduce counts, and whether every rank ended with identical parameters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from tricks_lib._validate import check_flag
from tricks_lib.formatting import format_seconds
from tricks_lib.measurements import Measurement
from tricks_lib.outcome import SummaryRow
from tricks_lib.progress import optional_progress_bar

__all__ = ["DDPResult", "launch_ddp", "free_port"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds tricks_lib/
_WORKER_MODULE = "tricks_lib.training.ddp_worker"  # what each torchrun process runs (``-m``): its ``main()``


@dataclass(frozen=True)
class DDPResult:
    """What rank 0 reports after a DDP run.

    Attributes:
        world_size: number of processes.
        backend: "gloo" or "nccl".
        device: "cpu" or "cuda".
        batch_size: samples per rank per optimizer step (split into ``accumulation_steps``).
        accumulation_steps: micro-batches per optimizer step (all but the last in ``no_sync()``
            when ``no_sync`` is True).
        no_sync: whether accumulation skipped the all-reduce of all but the last micro-batch; False
            all-reduces after every micro-batch (same gradients, more communication).
        steps: timed optimizer steps (after ``warmup_steps`` untimed ones).
        warmup_steps: untimed steps before the timed ones.
        step_times: wall-clock seconds of each timed step on rank 0, from a barrier-aligned start to
            the end of the step after a device sync (so it includes waiting for the slowest rank).
        samples_per_second: global throughput from the median step time,
            ``world_size * batch_size / median_step_seconds``.
        final_loss: last step's loss averaged over ranks.
        num_parameters: scalar parameters of the model.
        params_identical: every rank ended with bit-identical parameters.
        max_param_difference: largest absolute difference to rank 0 over all ranks and parameters.
        threads_per_process: torch intra-op threads of each rank.
        allreduce_calls: gradient all-reduces (one per DDP bucket) rank 0 launched in the timed steps.
        buckets: DDP gradient buckets of the model (all-reduces per synchronizing backward).
        backward_passes: backward passes (micro-batches) rank 0 ran in the timed steps.
    """

    record_kind: ClassVar[str] = "ddp"  # the kind ``record()`` files it under

    world_size: int
    backend: str
    device: str
    batch_size: int
    accumulation_steps: int
    steps: int
    step_times: tuple[float, ...]
    samples_per_second: float
    final_loss: float
    num_parameters: int
    params_identical: bool
    max_param_difference: float
    threads_per_process: int
    allreduce_calls: int
    buckets: int
    backward_passes: int
    warmup_steps: int = 0
    no_sync: bool = True

    @property
    def seconds(self) -> float:
        """Total timed seconds."""
        return float(sum(self.step_times))

    @property
    def median_step_seconds(self) -> float:
        """Median of the per-step times."""
        return float(np.median(self.step_times))

    @property
    def iqr_step_seconds(self) -> float:
        """Interquartile range of the per-step times."""
        return float(np.percentile(self.step_times, 75) - np.percentile(self.step_times, 25))

    @property
    def allreduces_per_step(self) -> float:
        """Gradient all-reduces per optimizer step: ``buckets`` when only the last micro-batch syncs,
        ``accumulation_steps * buckets`` when every micro-batch does."""
        return self.allreduce_calls / self.steps

    def as_measurement(self, label: str | None = None) -> Measurement:
        """The timed steps as a ``tricks_lib.Measurement`` (one block per step; items = global samples)."""
        return Measurement(
            label=label or f"DDP {self.world_size}x{self.backend}",
            times=self.step_times,
            number_per_block=1,
            device=self.device,
            num_threads=self.threads_per_process,
            items=self.world_size * self.batch_size,
        )

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        sync = (
            ""
            if self.accumulation_steps == 1
            else f", {self.accumulation_steps} micro-batches, no_sync {'on' if self.no_sync else 'off'}"
        )
        return (
            SummaryRow(
                variant=f"{self.world_size} x {self.backend} processes{sync}",
                device=self.device,
                median_s=self.median_step_seconds,
                iqr_s=self.iqr_step_seconds,
                items_per_second=self.samples_per_second,
            ),
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        out["step_times"] = list(self.step_times)
        return out

    def __repr__(self) -> str:
        same = "identical" if self.params_identical else f"DIFFERENT (max |diff| {self.max_param_difference:.3g})"
        return (
            f"DDPResult({self.world_size} x {self.backend}/{self.device}, batch {self.batch_size}/rank, "
            f"accumulate {self.accumulation_steps}{'' if self.no_sync else ' (no_sync off)'}, {self.steps} steps, step {format_seconds(self.median_step_seconds)} "
            f"(IQR {format_seconds(self.iqr_step_seconds)}), {self.samples_per_second:,.0f} samples/s, "
            f"all-reduces per step {self.allreduces_per_step:g}, parameters {same} on all ranks)"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>"
            for k, v in [
                ("processes", f"{self.world_size} ({self.backend}, {self.device})"),
                ("threads per process", self.threads_per_process),
                ("batch per rank", self.batch_size),
                ("accumulation steps", f"{self.accumulation_steps} (no_sync {'on' if self.no_sync else 'off'})"),
                ("timed steps", f"{self.steps} (after {self.warmup_steps} warm-up steps)"),
                (
                    "median step (IQR)",
                    f"{format_seconds(self.median_step_seconds)} ({format_seconds(self.iqr_step_seconds)})",
                ),
                ("throughput (from the median step)", f"{self.samples_per_second:,.0f} samples/s"),
                (
                    "gradient all-reduces",
                    f"{self.allreduce_calls} over {self.backward_passes} backward passes "
                    f"({self.buckets} bucket(s) per synchronizing backward)",
                ),
                ("final loss", f"{self.final_loss:.4f}"),
                ("parameters", f"{self.num_parameters:,}"),
                ("identical on all ranks", self.params_identical),
                ("max |difference| to rank 0", f"{self.max_param_difference:.3g}"),
            ]
        )
        return f"<table>{rows}</table>"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_launch_arguments(
    *,
    nproc: int,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    accumulation_steps: int,
    width: int,
    image_size: int,
    no_sync: bool,
    progress: bool,
) -> None:
    for name, value, low in [
        ("nproc", nproc, 1),
        ("steps", steps, 1),
        ("warmup_steps", warmup_steps, 0),
        ("batch_size", batch_size, 1),
        ("accumulation_steps", accumulation_steps, 1),
        ("width", width, 1),
        ("image_size", image_size, 8),
    ]:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    check_flag(no_sync, "no_sync")
    check_flag(progress, "progress")
    if batch_size < accumulation_steps:
        raise ValueError(f"batch_size ({batch_size}) must be >= accumulation_steps ({accumulation_steps})")


def _pick_backend(backend: str | None, nproc: int) -> str:
    """``backend``, or nccl when CUDA has at least ``nproc`` GPUs, else gloo; refused when unknown or short of GPUs."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "nccl" if gpus >= nproc and torch.distributed.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and gpus < nproc:
        raise ValueError(f"nccl with {nproc} processes needs {nproc} GPUs, found {gpus}; use backend='gloo'")
    return backend


def _worker_environment(backend: str, nproc: int, threads_per_process: int | None) -> dict[str, str]:
    """This process's environment for torchrun: the package importable, the threads per rank set, no GPU for gloo."""
    if threads_per_process is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads_per_process = max(1, cores // nproc)
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    env["OMP_NUM_THREADS"] = str(threads_per_process)
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run must not touch (or initialize) a GPU
    return env


def _torchrun_command(nproc: int, worker_arguments: list[str]) -> list[str]:
    """``sys.executable -m torch.distributed.run`` with ``nproc`` local ranks on a free port, each running the worker."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nproc}", "--nnodes=1",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}",
        "-m", _WORKER_MODULE, *worker_arguments,
    ]  # fmt: skip


def launch_ddp(
    *,
    nproc: int = 2,
    backend: str | None = None,
    steps: int = 20,
    warmup_steps: int = 2,
    batch_size: int = 32,
    accumulation_steps: int = 1,
    no_sync: bool = True,
    width: int = 16,
    image_size: int = 32,
    seed: int = 0,
    threads_per_process: int | None = None,
    timeout: float = 180.0,
    progress: bool = False,
) -> DDPResult:
    """Run ``ddp_worker.main`` in ``nproc`` processes with torchrun (``sys.executable -m torch.distributed.run``).

    Args:
        nproc: processes (ranks). With NCCL, at most the number of visible GPUs.
        backend: "gloo" or "nccl"; default nccl when CUDA has at least ``nproc`` GPUs, else gloo.
        steps, warmup_steps, batch_size, accumulation_steps, width, image_size, seed: passed to ``ddp_worker.main``.
        no_sync: accumulate with ``no_sync()`` (True, one all-reduce per optimizer step) or
            all-reduce after every micro-batch (False: the baseline that isolates what it saves).
        threads_per_process: OMP_NUM_THREADS of each process; default the CPU cores available to
            this process divided by ``nproc`` (at least 1), so ranks do not oversubscribe the cores.
        timeout: seconds before the whole process group is terminated.
        progress: show a progress bar over the steps (warm-up included) that rank 0 has finished.

    Returns:
        The ``DDPResult`` rank 0 wrote.

    Raises:
        TypeError: ``no_sync`` or ``progress`` is not a bool.
        ValueError: for bad arguments (e.g. nccl without enough GPUs).
        TimeoutError: if the run exceeds ``timeout``.
        RuntimeError: if torchrun fails; the message ends with the tail of its output.
    """
    _check_launch_arguments(
        nproc=nproc, steps=steps, warmup_steps=warmup_steps, batch_size=batch_size,
        accumulation_steps=accumulation_steps, width=width, image_size=image_size, no_sync=no_sync, progress=progress,
    )  # fmt: skip
    backend = _pick_backend(backend, nproc)
    env = _worker_environment(backend, nproc, threads_per_process)
    with tempfile.TemporaryDirectory(prefix="tricks_ddp_") as tmp:
        out, steps_file = Path(tmp) / "result.json", Path(tmp) / "steps_done"
        worker_arguments = [
            f"--out={out}", f"--backend={backend}", f"--steps={steps}", f"--warmup-steps={warmup_steps}",
            f"--batch-size={batch_size}", f"--accumulation-steps={accumulation_steps}",
            f"--width={width}", f"--image-size={image_size}", f"--seed={seed}",
        ] + ([] if no_sync else ["--sync-every-micro-batch"])  # fmt: skip
        cmd = _torchrun_command(nproc, worker_arguments)
        if progress:  # else rank 0 writes no step counts: nobody reads them
            cmd.append(f"--progress-file={steps_file}")
        # A new session, so a timeout can stop torchrun *and* its workers (one process group).
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        bar = optional_progress_bar(progress, warmup_steps + steps, f"DDP: {nproc} ranks, steps of rank 0")
        try:
            output = _wait(proc, timeout, steps_file, bar)
        finally:
            if bar is not None:
                bar.close()
        if proc.returncode != 0 or not out.exists():
            tail = output[-3000:].replace(tmp, "<tmp>")
            raise RuntimeError(f"torchrun exited with code {proc.returncode}; output tail:\n{tail}")
        data = json.loads(out.read_text())
    data["step_times"] = tuple(data["step_times"])
    return DDPResult(**data)


def _wait(proc: subprocess.Popen, timeout: float, steps_file: Path, bar) -> str:
    """``proc``'s output once it exits, moving ``bar`` (if any) to the steps rank 0 reports meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(deadline - time.monotonic(), 0.0)
        try:
            # Without a bar, one wait for the whole timeout; with one, wake twice a second to move it.
            output = proc.communicate(timeout=left if bar is None else min(0.5, left))[0]
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                _stop_group(proc)
                msg = f"DDP run exceeded {timeout:.0f} s and was stopped; raise timeout or lower steps"
                raise TimeoutError(msg) from None
            output = None
        if bar is not None:
            try:
                bar.update(int(steps_file.read_text()) - bar.n)
            except (OSError, ValueError):  # not written yet, or caught mid-write
                pass
        if output is not None:
            return output


def _stop_group(proc: subprocess.Popen) -> None:
    """Terminate the process group led by ``proc`` (torchrun and its workers), then kill what is left."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
