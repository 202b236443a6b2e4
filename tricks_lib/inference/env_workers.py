"""Worker processes that each start under their own environment and answer requests line by line.

Some settings only act when a process starts: ``LD_PRELOAD`` (a faster ``malloc`` such as jemalloc or
tcmalloc), ``OMP_NUM_THREADS``, ``KMP_AFFINITY``, ``MALLOC_CONF``. Setting them in a running kernel
changes nothing, so each environment gets its own fresh worker process: it runs a setup once, then
times blocks of a statement or evaluates expressions on request (``compare_environments`` in module
``env_compare`` times with them).

- ``evaluate_in_environments(expression, environments)``: what an expression gives in each environment's
  fresh process (e.g. whether jemalloc is really mapped: ``preloaded('jemalloc')``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping

from tricks_lib._processes import kill_group

__all__ = ["evaluate_in_environments"]

# The worker: reads its spec (one JSON line), runs setup, then answers one line per request:
# "<n>" -> seconds for n calls of stmt; "eval <expr>" -> repr of the expression; "threads" -> torch's
# intra-op thread count. ENV_NAME and preloaded() are predefined.
_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    # The reply channel is a private copy of stdout; fd 1 and sys.stdout go to stderr from here on, so nothing the
    # setup or the timed code prints (Python or a C library) can be read back as a timing.
    _reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
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
    print("ready", file=_reply, flush=True)
    for line in sys.stdin:
        line = line.strip()
        if line == "threads":
            print(json.dumps(torch.get_num_threads()), file=_reply, flush=True)
        elif line.startswith("eval "):
            print(json.dumps(repr(eval(line[5:], _ns))), file=_reply, flush=True)
        else:
            print(json.dumps(_block(int(line))), file=_reply, flush=True)
    """
)


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
            start_new_session=True,  # closing it stops what its setup started too; Ctrl-C reaches this process only
        )
        self.proc.stdin.write(json.dumps({**spec, "name": name}) + "\n")
        self.proc.stdin.flush()

    def read(self) -> str:
        """The worker's next reply line; RuntimeError if it exits, or does not answer within the timeout."""
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)  # replies are whole lines
        if not ready:
            self.close(kill=True)
            raise RuntimeError(
                f"environment {self.name!r}: the worker did not answer within {self.timeout:.0f} s "
                f"(a setup or statement that hangs?); it was stopped. Pass a longer timeout if it is only slow."
            )
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

    def close(self, *, kill: bool = False) -> None:
        """End the worker: let it finish (its stdin closed), or with ``kill`` stop its whole group now."""
        if self.proc.poll() is None and not kill:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc)  # also whatever its setup started
        if not self.stderr.closed:
            self.stderr.close()


def _start(environments, spec, timeout) -> dict[str, _Worker]:
    workers = {}
    try:
        for name, variables in environments.items():  # start all first: their imports overlap
            workers[name] = _Worker(name, variables, spec, timeout)
        for worker in workers.values():
            if worker.read() != "ready":
                raise RuntimeError(f"environment {worker.name!r}: unexpected worker output")
    except BaseException:  # an error, a timeout or Ctrl-C: stop every worker now, without waiting for them
        for worker in workers.values():
            worker.close(kill=True)
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
