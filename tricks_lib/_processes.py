"""Child processes that take their own children with them: each runs in a process group of its own, and
stopping it (a timeout, an error, Ctrl-C) stops the whole group, so no grandchild (a compile worker, a
DDP rank, a setup's own subprocess) is left running after its parent gave up on it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["kill_group", "run_in_own_group"]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of ``proc``'s group (started with ``start_new_session=True``), then reap ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_in_own_group(
    command: Sequence[str], *, input: str | None, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, input=..., capture_output=True, text=True, env=..., timeout=...)``, in a new
    process group that is killed whole when the call ends: on a timeout (``subprocess.TimeoutExpired``
    is raised after it), on any exception, and after a normal exit (stragglers the child left)."""
    proc = subprocess.Popen(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    kill_group(proc)  # the child is gone; anything still in its group is a leftover of it
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
