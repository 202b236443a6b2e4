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
- ``evaluate_in_environments(expression, environments)``: what an expression gives in each environment's
  fresh process (e.g. whether jemalloc is really mapped: ``preloaded('jemalloc')``).
- ``find_shared_library(filename)``: the path of a library such as ``libjemalloc.so.2``, or None.
- ``allocator_environments()``: glibc plus every allocator of ``ALLOCATORS`` found here (``LD_PRELOAD``),
  and the install line of each one missing; ``loaded_allocators(environments)``: which of them each
  environment's process really mapped.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path

import torch

from tricks_lib._validate import check_positive
from tricks_lib.env import pick_device
from tricks_lib.measurements import Comparison, Measurement, paired_row
from tricks_lib.progress import optional_progress_bar as _progress_bar
from tricks_lib.stats import DEFAULT_MIN_EFFECT, MIN_ROUNDS_FOR_VERDICT

__all__ = [
    "ALLOCATORS",
    "EnvironmentComparison",
    "allocator_environments",
    "compare_environments",
    "evaluate_in_environments",
    "find_shared_library",
    "loaded_allocators",
]

# name -> (shared library, the Debian/Ubuntu package that installs it)
ALLOCATORS = {
    "jemalloc": ("libjemalloc.so.2", "apt-get install -y libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "apt-get install -y libtcmalloc-minimal4"),
}
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")

# The worker: reads its spec (one JSON line), runs setup, then answers one line per request:
# "<n>" -> seconds for n calls of stmt; "eval <expr>" -> repr of the expression; "threads" -> torch's
# intra-op thread count. ENV_NAME and preloaded() are predefined.
_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    _spec = json.loads(sys.stdin.readline())
    import torch
    if _spec["threads"] is not None:
        torch.set_num_threads(_spec["threads"])
    _cuda = _spec["device"].startswith("cuda")

    def preloaded(name):
        with open("/proc/self/maps") as maps:
            return any(name in line for line in maps)

    _ns = {"ENV_NAME": _spec["name"], "preloaded": preloaded, "__name__": "__env_compare__"}
    exec(compile(_spec["setup"], "<setup>", "exec"), _ns)
    _stmt = compile(_spec["stmt"], "<stmt>", "exec")

    def _block(n):
        if _cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            exec(_stmt, _ns)
        if _cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(_spec["warmup"]):
        exec(_stmt, _ns)
    print("ready", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if line == "threads":
            print(json.dumps(torch.get_num_threads()), flush=True)
        elif line.startswith("eval "):
            print(json.dumps(repr(eval(line[5:], _ns))), flush=True)
        else:
            print(json.dumps(_block(int(line))), flush=True)
    """
)


def find_shared_library(filename: str) -> str | None:
    """The path of shared library ``filename`` (e.g. ``"libjemalloc.so.2"``) in the usual folders, or None."""
    if not isinstance(filename, str) or not filename:
        raise TypeError(f"filename must be a library file name such as 'libjemalloc.so.2', got {filename!r}")
    for folder in _LIBRARY_DIRS:
        path = Path(folder) / filename
        if path.exists():
            return str(path)
    return None


def allocator_environments() -> tuple[dict[str, dict[str, str | None]], dict[str, str]]:
    """Environments for an allocator comparison, and the allocators missing here.

    Returns:
        (environments, missing): environments maps ``"glibc malloc"`` to ``{"LD_PRELOAD": None}`` (unset)
        and each allocator of ``ALLOCATORS`` found on this machine to ``{"LD_PRELOAD": its path}``;
        missing maps each allocator not found to the command that installs it.
    """
    environments: dict[str, dict[str, str | None]] = {"glibc malloc": {"LD_PRELOAD": None}}
    missing = {}
    for name, (library, install) in ALLOCATORS.items():
        path = find_shared_library(library)
        if path is None:
            missing[name] = install
        else:
            environments[name] = {"LD_PRELOAD": path}
    return environments, missing


def loaded_allocators(
    environments: Mapping[str, Mapping[str, str | None]], *, timeout: float = 300.0
) -> dict[str, tuple[str, ...]]:
    """Which allocators of ``ALLOCATORS`` are mapped in a fresh process of each environment.

    An ``LD_PRELOAD`` that names a missing file, or that the dynamic loader refuses, leaves glibc's
    ``malloc`` in place without an error: this reads ``/proc/self/maps`` in the process to see.

    Returns:
        environment name -> the names of the allocators mapped there (empty: glibc's own).

    Raises:
        TypeError: a malformed ``environments``.
        RuntimeError: a process failed.
    """
    names = tuple(ALLOCATORS)
    seen = evaluate_in_environments(f"tuple(n for n in {names!r} if preloaded(n))", environments, timeout=timeout)
    return {env: tuple(ast.literal_eval(value)) for env, value in seen.items()}


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


def _check_environments(environments: object, baseline: str | None) -> dict[str, dict[str, str | None]]:
    if not isinstance(environments, Mapping) or not environments:
        raise TypeError("environments must be a non-empty dict of name -> {variable: value or None (unset)}")
    out = {}
    for name, variables in environments.items():
        if not isinstance(name, str):
            raise TypeError(f"environment names must be strings, got {name!r}")
        if not isinstance(variables, Mapping):
            raise TypeError(f"environment {name!r} must be a dict of variable -> value, got {type(variables).__name__}")
        for key, value in variables.items():
            if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                raise TypeError(f"environment {name!r}: {key!r} must map to a string or None (unset), got {value!r}")
        out[name] = dict(variables)
    if baseline is not None and baseline not in out:
        raise ValueError(f"baseline {baseline!r} is not one of the environments {list(out)}")
    return out


class _Worker:
    """One child process under one environment, answering requests line by line."""

    def __init__(self, name: str, variables: Mapping[str, str | None], spec: dict, timeout: float):
        env = dict(os.environ)
        for key, value in variables.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        env["PYTHONUNBUFFERED"] = "1"
        self.name, self.timeout = name, timeout
        # stderr goes to a file: a pipe nobody reads fills up and blocks a chatty worker (warnings).
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self.proc.stdin.write(json.dumps({**spec, "name": name}) + "\n")
        self.proc.stdin.flush()

    def read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=self.timeout)
            self.stderr.seek(0)
            tail = "\n".join(self.stderr.read().strip().splitlines()[-15:])
            self.close()
            raise RuntimeError(
                f"environment {self.name!r}: the worker failed (exit code {self.proc.returncode}):\n{tail}"
            )
        return line.strip()

    def ask(self, request: str) -> str:
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def _start(environments, spec, timeout) -> dict[str, _Worker]:
    workers = {}
    try:
        for name, variables in environments.items():  # start all first: their imports overlap
            workers[name] = _Worker(name, variables, spec, timeout)
        for worker in workers.values():
            if worker.read() != "ready":
                raise RuntimeError(f"environment {worker.name!r}: unexpected worker output")
    except BaseException:
        for worker in workers.values():
            worker.close()
        raise
    return workers


def evaluate_in_environments(
    expression: str, environments: Mapping[str, Mapping[str, str | None]], *, setup: str = "", timeout: float = 300.0
) -> dict[str, str]:
    """``repr`` of ``expression`` evaluated in a fresh process per environment, after ``setup``.

    The namespace predefines ``ENV_NAME`` (the environment's name) and ``preloaded(name)`` (True when
    a mapped library's path contains ``name``: whether an ``LD_PRELOAD`` really took effect).

    Raises:
        TypeError: a malformed ``environments`` or non-string code.
        RuntimeError: a process failed (the message ends with its error).
    """
    if not isinstance(expression, str) or not isinstance(setup, str):
        raise TypeError("expression and setup must be Python source strings")
    envs = _check_environments(environments, None)
    spec = {"setup": textwrap.dedent(setup), "stmt": "pass", "threads": None, "device": "cpu", "warmup": 0}
    workers = _start(envs, spec, timeout)
    try:
        return {name: json.loads(w.ask("eval " + expression.strip())) for name, w in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()


def _calibrate(worker: _Worker, target_block: float) -> int:
    number = 1
    while True:
        elapsed = float(worker.ask(str(number)))
        if elapsed >= target_block or number >= 1 << 24:
            return number
        number = max(number + 1, int(number * min(target_block / max(elapsed, 1e-9) * 1.1, 10.0)))


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
    dev = pick_device(device) if device is not None else pick_device()
    spec = {
        "setup": textwrap.dedent(setup),
        "stmt": textwrap.dedent(stmt),
        "threads": threads,
        "device": str(dev),
        "warmup": warmup,
    }
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
            for _ in range(count):
                order = names[:]
                rng.shuffle(order)
                for name in order:
                    times[name].append(float(workers[name].ask(str(numbers[name]))) / numbers[name])
                if bar is not None:
                    bar.update(1)
            per_replicate.append(count)
        finally:
            for worker in workers.values():
                worker.close()
    if bar is not None:
        bar.close()
    replicate_rounds = tuple(per_replicate) if replicates > 1 else ()
    measurements = {
        name: Measurement(
            label=name,
            times=tuple(times[name]),
            number_per_block=numbers[name],
            device=str(dev),
            num_threads=worker_threads[name],
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
        rounds=sum(per_replicate),
        device=str(dev),
        num_threads=worker_threads[baseline],
        min_effect=min_effect,
        replicate_rounds=replicate_rounds,
        thread_counts=tuple(worker_threads[name] for name in names),
    )
