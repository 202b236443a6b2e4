"""``launch_torchrun``: a worker script on N local ranks, launched with ``torchrun`` as from a shell, and each
rank's results read back from a JSON file it wrote.

Results travel through files, not stdout, for two reasons: ranks print interleaved, and a rank that has
written its results may still crash while the process group is torn down (gloo on a CPU aborts at exit
now and then, after ``destroy_process_group``). Such a crash must not fail a run whose every rank finished
its work: ``launch_torchrun`` returns the results and says the launch ended with an error at teardown.
A rank whose file is missing did not finish: that raises, with the end of the launch's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tricks_lib._processes import run_in_own_group
from tricks_lib._validate import check_positive

__all__ = ["RESULT_FOLDER_VARIABLE", "TorchrunResult", "launch_torchrun"]

# The folder each rank writes ``rank<RANK>.json`` into (``write_rank_result`` in the worker script's own words).
RESULT_FOLDER_VARIABLE = "TRICKS_RANK_RESULTS"


@dataclass(frozen=True)
class TorchrunResult:
    """What each rank wrote (``ranks[r]`` is rank r's dict), and how the launch ended."""

    ranks: tuple[dict, ...]
    returncode: int
    teardown_error: str  # "" or the last lines of the output when a rank crashed after writing its results
    seconds: float  # the whole launch, torchrun's start and the ranks' imports included

    def __repr__(self) -> str:
        ended = "cleanly" if self.returncode == 0 else f"with exit code {self.returncode} at teardown"
        return f"TorchrunResult({len(self.ranks)} ranks, {self.seconds:.1f} s, ended {ended})"


def launch_torchrun(
    script: str | os.PathLike,
    *,
    processes: int = 2,
    args: Sequence[str] = (),
    threads: int = 1,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> TorchrunResult:
    """Run ``torchrun --standalone --nproc_per_node=processes script *args``; return each rank's results.

    Each rank must write its results as JSON to ``$TRICKS_RANK_RESULTS/rank<RANK>.json`` (the folder is made
    here, empty, for this launch). The launch runs in a process group of its own: a timeout or an error stops
    every rank with it.

    Args:
        script: the worker script's path.
        processes: local ranks (``--nproc_per_node``).
        args: the script's own arguments.
        threads: ``OMP_NUM_THREADS`` of each rank (ranks sharing a few cores oversubscribe them otherwise).
        env: more environment variables for the ranks.
        timeout: seconds the whole launch may take.

    Returns:
        A ``TorchrunResult``; ``teardown_error`` is set when the launch failed after every rank wrote its file.

    Raises:
        TypeError / ValueError: a script that is not a path to a file, non-positive counts.
        RuntimeError: a rank did not write its results (the message ends with the launch's output), or the
            launch timed out.
    """
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"script must be the path of a worker script, got {type(script).__name__}")
    if not Path(script).is_file():
        raise ValueError(f"script {str(script)!r} is not a file: write the worker script first")
    check_positive(processes, "processes", allow_none=False, integer=True)
    check_positive(threads, "threads", allow_none=False, integer=True)
    check_positive(timeout, "timeout", allow_none=False)
    if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
        raise TypeError(f"args must be a list of strings, got {args!r}")
    with tempfile.TemporaryDirectory(prefix="tricks-torchrun-") as folder:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        environment = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads), RESULT_FOLDER_VARIABLE: folder}
        start = time.perf_counter()
        try:
            done = run_in_own_group([*command, str(script), *args], input=None, env=environment, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"torchrun did not finish within {timeout:.0f} s (every rank was stopped)") from err
        seconds = time.perf_counter() - start
        files = [Path(folder) / f"rank{r}.json" for r in range(processes)]
        tail = "\n".join((done.stderr + done.stdout).strip().splitlines()[-20:])
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise RuntimeError(f"torchrun exit code {done.returncode}; no results from {missing}:\n{tail}")
        ranks = tuple(json.loads(f.read_text()) for f in files)
    return TorchrunResult(ranks, done.returncode, tail if done.returncode else "", seconds)
