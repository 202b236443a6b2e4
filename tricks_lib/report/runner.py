"""The main job: execute the notebooks headless on this machine and summarize every measurement.

``python -m tricks_lib run`` runs each notebook in a fresh kernel of this interpreter (nbclient),
writes the executed notebooks and a summary (Markdown, JSON and HTML) into an output folder, and fails
naming the notebook and cell that broke. ``--refresh`` also stores the outputs back into
``notebooks/`` (after checking them for errors and local paths), which is the only way the stored
outputs are meant to change.

Which notebooks (``locate_notebooks``): ``--notebooks DIR`` when given; else the ``notebooks/`` folder
of the checkout this package was imported from (a clone, or an editable install); else the copies
shipped inside an installed package (``tricks_lib/notebooks/`` in the wheel). The shipped copies are
only read: their kernels start in the output folder and their run times are recorded there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib.env import QUICK_ENV_VAR, describe
from tricks_lib.progress import PROGRESS_ENV_VAR
from tricks_lib.report.notebook_source import (
    hygiene_problems,
    is_shipped,
    shipped_notebook_dir,
)
from tricks_lib.report.results import NOTEBOOK_ENV_VAR, RESULTS_ENV_VAR, load_records
from tricks_lib.report.run_times import record_run_time, recorded_cell_seconds, run_time_line, stamp_run_time
from tricks_lib.report.summary import NotebookStatus, write_summary_files

__all__ = ["EarlierResults", "NotebookRun", "earlier_results", "run_notebooks", "write_summary"]

CURRENT_ENV_KERNEL = "python3"
# The kernelspec JupyterLab writes for this kernel: a stored notebook with another display name shows
# as "modified" the moment a reader opens it.
STANDARD_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CUBLAS_ENV_VAR = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC_CONFIG = ":4096:8"


class _CurrentEnvKernelSpecs(KernelSpecManager):
    """Always start kernels in this interpreter, whatever kernelspecs are installed elsewhere."""

    def get_kernel_spec(self, kernel_name):
        import ipykernel.kernelspec

        return self.kernel_spec_class(
            resource_dir=ipykernel.kernelspec.RESOURCES, **ipykernel.kernelspec.get_kernel_dict()
        )


@dataclass
class NotebookRun:
    """What happened to one notebook."""

    name: str
    ok: bool
    seconds: float
    failed_cell: int | None = None  # 0-based index among all cells of the notebook
    error: str | None = None
    failed_cell_label: str | None = None  # the failed cell as a reader finds it
    problems: list[str] = field(default_factory=list)  # hygiene problems that blocked a refresh
    interrupted: bool = False  # Ctrl-C stopped this notebook, or it never ran because of one
    finished_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    carried_over: bool = False  # not run now: kept from an earlier run of the same folder (a subset run)

    @property
    def failure_location(self) -> str:
        return self.failed_cell_label or "before any cell ran"

    def describe_failure(self) -> str:
        return f"{self.name}.ipynb, {self.failure_location}: {self.error}"


@dataclass(frozen=True)
class EarlierResults:
    """The run whose summary an output folder already holds, and whether a new run may merge into it."""

    statuses: tuple[dict, ...]
    compatible: bool
    reason: str  # why it cannot be merged ("" when it can)


def earlier_results(out_dir: Path, *, quick: bool) -> EarlierResults | None:
    """Read ``out_dir/summary.json`` of an earlier run, or None when there is none (or it is unreadable).

    A run of some notebooks merges into the earlier run's summary (the other notebooks' rows are kept,
    each stamped with when it ran) only when both ran in the same mode on the same machine; otherwise
    the new run replaces it, and says so.
    """
    path = Path(out_dir) / "summary.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        statuses, mode, machine = earlier["notebooks"], earlier["mode"], earlier["machine_summary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    here = dataclasses.replace(describe(), quick_mode=quick).summary()
    wanted = "quick" if quick else "full"
    if mode != wanted:
        return EarlierResults(tuple(statuses), False, f"was a {mode}-mode run, this one is {wanted} mode")
    if machine != here:
        return EarlierResults(tuple(statuses), False, f"ran on another machine ({machine})")
    if any("outcome" not in row for row in earlier.get("measurements", ())):
        return EarlierResults(tuple(statuses), False, "was written by an older tricks_lib (its rows carry no outcome)")
    return EarlierResults(tuple(statuses), True, "")


def _carry_over(out_dir: Path, names: set[str], quick: bool) -> tuple[list[NotebookRun], list[str]]:
    """The earlier runs and record lines of the notebooks this run does not execute (see earlier_results)."""
    earlier = earlier_results(out_dir, quick=quick)
    records_path = Path(out_dir) / "records.jsonl"
    if earlier is None or not earlier.compatible or not records_path.exists():
        return [], []
    runs = [
        NotebookRun(
            s["notebook"],
            s["ok"],
            s["seconds"],
            None,
            s["error"],
            failed_cell_label=s["failed_cell"],
            finished_at=s.get("finished_at") or "an earlier run",
            carried_over=True,
        )
        for s in earlier.statuses
        if s["notebook"] not in names
    ]
    kept = {r.name for r in runs}
    lines = [
        line
        for line in records_path.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get("notebook") in kept
    ]
    return runs, lines


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _last_line(text: str) -> str:
    lines = [ln for ln in _ANSI.sub("", text).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "failed"


def _execute(
    nb, folder: Path, timeout: int, on_cell: Callable[[float], None], on_interrupt: Callable[[], None]
) -> tuple[int | None, str | None]:
    """Run one notebook in place; returns (failed cell index or None, error text or None).

    While it runs, nbclient owns SIGINT/SIGTERM (its handler shuts the kernel down, which then reads
    as a dead kernel); ``on_interrupt`` is called when that handler fired.
    """
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    state: dict[str, int] = {}
    # IPC sockets in a private folder: no TCP ports to collide on a shared machine, no network at all.
    ipc_dir = tempfile.mkdtemp(prefix="tricks-kernel-")
    # The async manager: with the blocking one, nbclient cannot enforce the per-cell timeout.
    km = AsyncKernelManager(
        kernel_name=CURRENT_ENV_KERNEL,
        kernel_spec_manager=_CurrentEnvKernelSpecs(),
        transport="ipc",
        ip=os.path.join(ipc_dir, "kernel"),
    )
    client = NotebookClient(
        nb,
        km=km,
        timeout=timeout,
        kernel_name=CURRENT_ENV_KERNEL,
        record_timing=False,
        resources={"metadata": {"path": str(folder)}},
        on_cell_start=lambda cell, cell_index: state.update(running=cell_index, started=time.perf_counter()),
        on_cell_executed=lambda cell, cell_index, execute_reply: on_cell(time.perf_counter() - state["started"]),
    )
    try:
        client.execute()
    except CellExecutionError as err:
        return state.get("running"), _last_line(str(err))
    except (CellTimeoutError, DeadKernelError) as err:
        return state.get("running"), f"{type(err).__name__}: {_last_line(str(err))}"
    except Exception as err:  # the kernel did not start, or died oddly: report it, go on with the rest
        return state.get("running"), f"{type(err).__name__}: {_last_line(str(err))}"
    finally:
        # nbclient's signal handler leaves this future behind when Ctrl-C (or SIGTERM) stopped the run.
        if getattr(client, "_async_cleanup_kernel_future", None) is not None:
            on_interrupt()
        # We own the kernel manager, so nbclient leaves the kernel running: stop it here.
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
        shutil.rmtree(ipc_dir, ignore_errors=True)
    return None, None


def _write_notebook(nb, path: Path) -> None:
    """Write a notebook atomically: a full disk or a kill mid-write never leaves a truncated notebook.

    The kernelspec is the standard one, so JupyterLab does not mark the notebook modified on open.
    """
    nb.metadata["kernelspec"] = dict(STANDARD_KERNELSPEC)
    text = nbformat.writes(nb)
    if not text.endswith("\n"):
        text += "\n"  # as nbformat.write does
    write_bytes_atomic(path, text.encode("utf-8"))


def _cell_label(nb, index: int | None) -> str | None:
    """'cell 5 of 24 (code cell 3: `first line`)' for a 0-based cell index, as a reader counts."""
    if index is None:
        return None
    cell = nb.cells[index]
    code_number = sum(c.cell_type == "code" for c in nb.cells[: index + 1])
    first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
    return f"cell {index + 1} of {len(nb.cells)} (code cell {code_number}: `{first[:60]}`)"


def run_notebooks(
    paths: Sequence[Path],
    out_dir: Path,
    *,
    quick: bool,
    refresh: bool = False,
    timeout: int = 1800,
    progress: bool = True,
) -> list[NotebookRun]:
    """Execute ``paths`` in order; write executed copies (and results) under ``out_dir``.

    With ``refresh``, a notebook that ran cleanly and passes ``hygiene_problems`` is also written
    back in place. Records from ``tricks_lib.report.results.record`` land in ``out_dir/records.jsonl``.
    The installed package's shipped notebooks are only read: their kernels start in
    ``out_dir/notebooks`` and their run times go to ``out_dir/run_times.json``.

    Raises:
        ValueError: ``refresh`` for the installed package's shipped notebooks (refresh a checkout).
    """
    out_dir = Path(out_dir)
    if refresh and any(is_shipped(p.parent) for p in paths):
        raise ValueError(
            "--refresh stores outputs back into a checkout's notebooks/, not into the installed package's "
            f"copies ({shipped_notebook_dir()}); run it in a clone of the repository"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    executed_dir = out_dir / "notebooks"
    executed_dir.mkdir(exist_ok=True)
    records_path = out_dir / "records.jsonl"
    # A run of some notebooks keeps the earlier run's other notebooks (same mode, same machine).
    carried_runs, carried_lines = _carry_over(out_dir, {p.stem for p in paths}, quick)
    records_path.write_text("".join(line + "\n" for line in carried_lines), encoding="utf-8")
    saved_env = {
        k: os.environ.get(k)
        for k in (QUICK_ENV_VAR, RESULTS_ENV_VAR, NOTEBOOK_ENV_VAR, CUBLAS_ENV_VAR, PROGRESS_ENV_VAR)
    }
    runs = []
    interrupted = {"now": False}
    machine = describe().summary().rsplit(" | ", 1)[0]  # without the mode, which the ledger keeps apart

    def on_sigint(signum, frame):
        # Ctrl-C reaches the kernels too (same process group); note it here so that the run stops
        # after this notebook instead of going on with the next one.
        interrupted["now"] = True
        raise KeyboardInterrupt

    main_thread = _in_main_thread()
    previous_handler = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        os.environ[QUICK_ENV_VAR] = "1" if quick else "0"
        # cuBLAS reads this once, at the first cuBLAS call of a process: it must be in the kernel's
        # environment from the start for 07's deterministic mode to work on CUDA. It only fixes the
        # workspace size (a few MiB), so setting it for every notebook costs nothing measurable.
        os.environ.setdefault(CUBLAS_ENV_VAR, CUBLAS_DETERMINISTIC_CONFIG)
        # Headless: the cells' own progress bars would only land as text in the stored outputs; the
        # runner shows one bar per notebook instead.
        os.environ[PROGRESS_ENV_VAR] = "0"
        os.environ[RESULTS_ENV_VAR] = str(records_path.resolve())
        for number, path in enumerate(paths):
            if interrupted["now"]:
                runs += [
                    NotebookRun(p.stem, False, 0.0, None, "interrupted: not run", interrupted=True)
                    for p in paths[number:]
                ]
                break
            os.environ[NOTEBOOK_ENV_VAR] = path.stem
            start = time.perf_counter()
            try:
                nb = nbformat.read(path, as_version=4)
            except Exception as err:  # not a notebook (corrupt JSON, wrong schema): name it, go on
                runs.append(NotebookRun(path.stem, False, 0.0, None, f"cannot be read: {_last_line(str(err))}"))
                continue
            n_code = sum(c.cell_type == "code" for c in nb.cells)
            shipped = is_shipped(path.parent)
            ledger_dir = out_dir if shipped else path.parent  # never write into an installed package
            kernel_dir = executed_dir if shipped else path.parent
            # The bar advances by each cell's last recorded time, so that its estimate means something
            # (one cell of 01 takes minutes, most take milliseconds); by cells where none is recorded.
            weights = recorded_cell_seconds(ledger_dir, path.stem, quick=quick, cells=n_code)
            if weights is None and shipped:
                weights = recorded_cell_seconds(path.parent, path.stem, quick=quick, cells=n_code)
            cell_seconds: list[float] = []
            bar = _progress(weights, n_code, path.stem, progress)

            def on_cell(seconds: float, bar=bar, weights=weights, cell_seconds=cell_seconds) -> None:
                bar.update(weights[len(cell_seconds)] if weights else 1)
                cell_seconds.append(seconds)

            try:
                failed_cell, error = _execute(nb, kernel_dir, timeout, on_cell, lambda: interrupted.update(now=True))
            except KeyboardInterrupt:
                interrupted["now"], failed_cell, error = True, None, None
            finally:
                if main_thread:  # nbclient restores the default handler when it is done
                    signal.signal(signal.SIGINT, on_sigint)
            bar.close()
            if interrupted["now"]:
                error = "interrupted (Ctrl-C)"
            run = NotebookRun(
                path.stem,
                error is None,
                time.perf_counter() - start,
                failed_cell,
                error,
                failed_cell_label=_cell_label(nb, failed_cell),
                interrupted=interrupted["now"],
            )
            if run.ok:
                # The ledger beside the notebooks: what the title cell's run-time line reads on --refresh.
                record_run_time(
                    ledger_dir, path.stem, quick=quick, seconds=run.seconds, machine=machine, cells=cell_seconds
                )
            _write_notebook(nb, executed_dir / path.name)
            if run.ok and refresh:
                run.problems = hygiene_problems(nb)
                if run.problems:
                    run.ok = False
                    run.error = "outputs not stored: " + "; ".join(run.problems[:5])
                else:
                    stamp_run_time(nb, run_time_line(path.parent, path.stem))
                    _write_notebook(nb, path)
            runs.append(run)
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return sorted(carried_runs + runs, key=lambda r: r.name) if carried_runs else runs


def _progress(weights: list[float] | None, cells: int, name: str, enabled: bool):
    from tqdm.auto import tqdm

    if weights and sum(weights) >= 1.0:  # under a second in all: counting cells reads as well
        total = sum(weights)  # not rounded: a total below the sum of its updates warns "clamping frac"
        return tqdm(total=total, desc=name, unit="s", disable=not enabled, leave=True, bar_format=_TIMED_BAR)
    return tqdm(total=cells, desc=name, unit="cell", disable=not enabled, leave=True)


# Seconds of the last recorded run done / in all, and the time left estimated from them.
_TIMED_BAR = "{l_bar}{bar}| {n:.0f}/{total:.0f} s of the last run [{elapsed}<{remaining}]"


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def write_summary(out_dir: Path, runs: Sequence[NotebookRun], *, quick: bool) -> tuple[Path, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.html`` from the run's records; returns (md, json).

    The HTML page (``out_dir/summary.html``) is drawn from the same document as ``summary.json``.
    """
    env = dataclasses.replace(describe(), quick_mode=quick)  # the mode the notebooks ran in
    statuses = [
        NotebookStatus(r.name, r.ok, round(r.seconds, 2), r.failed_cell_label, r.error, r.finished_at, r.carried_over)
        for r in runs
    ]
    return write_summary_files(out_dir, env, statuses, load_records(out_dir / "records.jsonl"))
