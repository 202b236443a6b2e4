"""The main job: execute the notebooks headless on this machine and summarize every measurement.

``python -m tricks_lib run`` runs each notebook in a fresh kernel of this interpreter (nbclient),
writes the executed notebooks and a summary (Markdown, JSON and HTML) into an output folder, and fails
naming the notebook and cell that broke. ``--refresh`` also stores the outputs back into
``notebooks/`` (after checking them for errors and local paths), which is the only way the stored
outputs are meant to change. ``plan_run`` decides everything a run does from its arguments (and what
it reads: the earlier summary, this machine), writing nothing; ``run_plan`` carries the plan out.
Which notebooks: ``notebook_source.locate_notebooks``; the installed package's copies are only read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import nbformat
from jupyter_client.kernelspec import KernelSpecManager

from tricks_lib.env import QUICK_ENV_VAR, describe
from tricks_lib.progress import PROGRESS_ENV_VAR
from tricks_lib.report.notebook_source import (
    NotebookSource,
    cell_label,
    hygiene_problems,
    is_shipped,
    shipped_notebook_dir,
)
from tricks_lib.report.notebook_source import write_notebook as _write_notebook
from tricks_lib.report.results import NOTEBOOK_ENV_VAR, RESULTS_ENV_VAR, load_records
from tricks_lib.report.run_times import (
    CellProgress,
    EarlierResults,
    earlier_results,
    record_run_time,
    run_time_line,
    stamp_run_time,
)
from tricks_lib.report.summary import NotebookStatus, write_summary_files
from tricks_lib.repro.determinism import CUBLAS_DETERMINISTIC_CONFIGS

__all__ = ["NotebookRun", "RunPlan", "plan_run", "run_notebooks", "run_plan", "write_summary"]

CURRENT_ENV_KERNEL = "python3"
CUBLAS_ENV_VAR = "CUBLAS_WORKSPACE_CONFIG"


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
class RunPlan:
    """Everything a run does, decided before it starts (``plan_run``); ``run_plan`` carries it out."""

    source: NotebookSource  # where the notebooks come from
    notebooks: tuple[Path, ...]  # the notebooks to run, in order
    out_dir: Path  # the executed notebooks, records.jsonl and the summary go here
    records: Path  # out_dir/records.jsonl, resolved: the kernels append their records to it
    quick: bool
    refresh: bool  # store clean outputs back into the notebooks
    record_times: bool  # record run times in the ledger beside the notebooks (else in out_dir); refresh implies it
    timeout: int  # seconds one cell may run
    progress: bool  # one bar per notebook
    shipped: bool  # the installed package's copies: only read (kernels and run times in out_dir)
    earlier: EarlierResults | None  # the summary out_dir already holds
    merge: bool  # keep the earlier run's other notebooks (else this run's summary replaces it)
    machine: str  # this machine as the run-time ledger names it
    kernel_env: Mapping[str, str]  # set in every kernel's environment (on top of this process's)

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    @property
    def replace_reason(self) -> str | None:
        """Why this run replaces the earlier summary instead of merging into it (None: nothing to replace)."""
        return self.earlier.reason if self.earlier is not None and not self.earlier.compatible else None

    @property
    def executed_dir(self) -> Path:
        return self.out_dir / "notebooks"

    @property
    def kernel_dir(self) -> Path:
        """Where the kernels start: beside the notebooks, or for the shipped copies in the output folder."""
        return self.executed_dir if self.shipped else self.source.folder

    @property
    def ledger_dir(self) -> Path:
        """Where run times are recorded: beside the notebooks when asked (``--refresh``, ``--record-times``), so a
        plain run leaves the checkout as it was; else in the output folder. Never inside an installed package."""
        return self.source.folder if self.record_times and not self.shipped else self.out_dir

    def kernel_env_for(self, notebook: str) -> dict[str, str]:
        """The variables set in ``notebook``'s kernel: the run's, and the notebook's name for its records."""
        return {**self.kernel_env, NOTEBOOK_ENV_VAR: notebook}


def _kernel_env(quick: bool, records: Path, environ: Mapping[str, str]) -> dict[str, str]:
    return {
        QUICK_ENV_VAR: "1" if quick else "0",
        # cuBLAS reads this once, at the first cuBLAS call of a process: it must be in the kernel's
        # environment from the start for 07's deterministic mode to work on CUDA. It only fixes the
        # workspace size (a few MiB), so setting it for every notebook costs nothing measurable.
        CUBLAS_ENV_VAR: environ.get(CUBLAS_ENV_VAR, CUBLAS_DETERMINISTIC_CONFIGS[0]),
        # Headless: the cells' own progress bars would only land as text in the stored outputs; the
        # runner shows one bar per notebook instead.
        PROGRESS_ENV_VAR: "0",
        RESULTS_ENV_VAR: str(records),
    }


def _source_of(paths: Sequence[Path]) -> NotebookSource:
    folders = {Path(p).parent for p in paths}
    if len(folders) > 1:
        raise ValueError(f"run the notebooks of one folder at a time, not of {sorted(map(str, folders))}")
    folder = folders.pop() if folders else Path(".")
    return NotebookSource(folder, "installed package" if is_shipped(folder) else "--notebooks")


def plan_run(
    paths: Sequence[Path],
    out_dir: Path,
    *,
    quick: bool,
    refresh: bool = False,
    record_times: bool = False,
    timeout: int = 1800,
    progress: bool = True,
    source: NotebookSource | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunPlan:
    """Decide everything a run of ``paths`` into ``out_dir`` does; reads files and this machine, writes nothing.

    ``source``: where ``paths`` were found (default: their folder); ``environ``: the environment the
    kernels inherit (default: ``os.environ``), read for the variables the run leaves as the caller set them.
    ``record_times``: record the run times beside the notebooks (``refresh`` implies it); else in ``out_dir``.

    Raises:
        ValueError: ``refresh`` or ``record_times`` for the installed package's shipped notebooks (use a
            checkout), or ``paths`` from several folders.
    """
    source = source or _source_of(paths)
    shipped = is_shipped(source.folder)
    if (refresh or record_times) and shipped:
        raise ValueError(
            "--refresh and --record-times write into a checkout's notebooks/, not into the installed package's "
            f"copies ({shipped_notebook_dir()}); run it in a clone of the repository"
        )
    out_dir = Path(out_dir)
    records = (out_dir / "records.jsonl").resolve()
    here = describe()
    earlier = earlier_results(out_dir, quick=quick, here=here)
    return RunPlan(
        source=source,
        notebooks=tuple(Path(p) for p in paths),
        out_dir=out_dir,
        records=records,
        quick=quick,
        refresh=refresh,
        record_times=refresh or record_times,
        timeout=timeout,
        progress=progress,
        shipped=shipped,
        earlier=earlier,
        merge=earlier is not None and earlier.compatible and records.exists(),
        machine=here.summary().rsplit(" | ", 1)[0],  # without the mode, which the ledger keeps apart
        kernel_env=MappingProxyType(_kernel_env(quick, records, os.environ if environ is None else environ)),
    )


def _carry_over(plan: RunPlan) -> tuple[list[NotebookRun], list[str]]:
    """The earlier runs and record lines of the notebooks this run does not execute (when it merges)."""
    if not plan.merge:
        return [], []
    names = {p.stem for p in plan.notebooks}
    runs = [
        NotebookRun(
            s["notebook"],
            s.get("ok") is True,
            float(s.get("seconds") or 0.0),
            None,
            s.get("error") if s.get("ok") is True else s.get("error") or "no status in the earlier summary",
            failed_cell_label=s.get("failed_cell"),
            finished_at=s.get("finished_at") or "an earlier run",
            carried_over=True,
        )
        for s in plan.earlier.statuses
        if isinstance(s, dict) and isinstance(s.get("notebook"), str) and s["notebook"] not in names
    ]
    kept = {r.name for r in runs}
    lines = [
        line
        for line in plan.records.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get("notebook") in kept
    ]
    return runs, lines


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _last_line(text: str) -> str:
    lines = [ln for ln in _ANSI.sub("", text).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "failed"


def _execute(
    nb, folder: Path, timeout: int, env: dict, on_cell: Callable[[float], None], on_interrupt: Callable[[], None]
) -> tuple[int | None, str | None]:
    """Run one notebook in place; returns (failed cell index or None, error text or None).

    The kernel starts in ``folder`` with this process's environment plus ``env`` (this process's own
    environment is left as it is). While it runs, nbclient owns SIGINT/SIGTERM (its handler shuts the
    kernel down, which then reads as a dead kernel); ``on_interrupt`` is called when that handler fired.
    """
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    state: dict[str, int] = {}
    # IPC sockets in a private folder: no TCP ports to collide on a shared machine, no network at all.
    ipc_dir = tempfile.mkdtemp(prefix="tricks-kernel-")
    # The kernel's temporary files in a folder of its own, removed with it: the kernel is stopped, not
    # exited, so its own clean-up (TemporaryDirectory, atexit) never runs, and its children's neither.
    scratch = tempfile.mkdtemp(prefix="tricks-tmp-")
    env = {**env, "TMPDIR": scratch, **_kept_caches()}
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
        client.execute(env={**os.environ, **env})  # the kernel manager's start_kernel(env=...)
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
        run_sync(_reap)(client)
        # We own the kernel manager, so nbclient leaves the kernel running: stop it here.
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
        shutil.rmtree(ipc_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return None, None


def _kept_caches() -> dict[str, str]:
    """Inductor's compile cache where it would be without the kernel's own TMPDIR (a cache meant to last, not a
    leftover), unless the caller chose one: torch's default, ``<temp folder>/torchinductor_<user>``."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return {}
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")}


async def _reap(client) -> None:
    """Cancel, and wait for, the tasks ``client`` left on this thread's event loop.

    After a kernel died (Ctrl-C shuts it down) nbclient leaves its kernel-alive poller pending: the next
    notebook's run would wake it, it would fail, and its unread error would be logged whenever it is
    garbage-collected (on Python 3.11, inside whatever ``ast.parse`` runs then: a SystemError).
    """
    frames = {t: getattr(t.get_coro(), "cr_frame", None) for t in asyncio.all_tasks()}
    left = [t for t, frame in frames.items() if frame is not None and frame.f_locals.get("self") is client]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


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
    ``out_dir/notebooks`` and their run times go to ``out_dir/run_times.json``. The same as
    ``run_plan(plan_run(...))``.

    Raises:
        ValueError: ``refresh`` for the installed package's shipped notebooks (refresh a checkout).
    """
    return run_plan(plan_run(paths, out_dir, quick=quick, refresh=refresh, timeout=timeout, progress=progress))


def run_plan(plan: RunPlan) -> list[NotebookRun]:
    """Carry out ``plan``: each notebook in a fresh kernel, in order; returns every notebook's run.

    A run that merges (``plan.merge``) returns the earlier run's other notebooks too (``carried_over``),
    sorted by name with this run's. Ctrl-C stops the run after the notebook it interrupted; the ones
    after it are returned as not run (``interrupted``).
    """
    plan.executed_dir.mkdir(parents=True, exist_ok=True)
    carried_runs, carried_lines = _carry_over(plan)
    plan.records.write_text("".join(line + "\n" for line in carried_lines), encoding="utf-8")
    runs: list[NotebookRun] = []
    with _CtrlC() as ctrl_c:
        for number, path in enumerate(plan.notebooks):
            if ctrl_c.pressed:
                runs += [
                    NotebookRun(p.stem, False, 0.0, None, "interrupted: not run", interrupted=True)
                    for p in plan.notebooks[number:]
                ]
                break
            # Until it ends, the summary on disk lists this notebook and the ones after it as not finished: a run
            # killed now (no Ctrl-C handler runs on SIGKILL) leaves a summary a later --only run carries over as
            # failed, never an earlier run's "ok" beside this run's partial records.
            _write_progress_summary(plan, carried_runs + runs, plan.notebooks[number:])
            runs.append(_run_one(plan, path, ctrl_c))
    return sorted(carried_runs + runs, key=lambda r: r.name) if carried_runs else runs


def _write_progress_summary(plan: RunPlan, done: list[NotebookRun], pending: Sequence[Path]) -> None:
    unfinished = [NotebookRun(p.stem, False, 0.0, None, _NOT_FINISHED) for p in pending]
    try:
        write_summary(plan.out_dir, sorted(done + unfinished, key=lambda r: r.name), quick=plan.quick, json_only=True)
    except OSError:
        pass  # a full disk: the notebooks still run, and writing the final summary reports it (in the terminal)


_NOT_FINISHED = "did not finish: the run stopped while this notebook ran or before it (killed, or out of memory?)"


class _CtrlC:
    """While a run lasts, Ctrl-C (which reaches the kernels too: same process group) marks it stopped.

    ``pressed``: it came, through our handler (which raises KeyboardInterrupt) or nbclient's (``press``).
    """

    def __init__(self) -> None:
        self.pressed = False
        self._main_thread = threading.current_thread() is threading.main_thread()  # where handlers are set
        self._previous = None

    def press(self) -> None:
        self.pressed = True

    def _on_sigint(self, signum, frame):
        self.pressed = True
        raise KeyboardInterrupt

    def rearm(self) -> None:
        """Take SIGINT back: nbclient restores the default handler when it is done."""
        if self._main_thread:
            signal.signal(signal.SIGINT, self._on_sigint)

    def __enter__(self) -> _CtrlC:
        if self._main_thread:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _run_one(plan: RunPlan, path: Path, ctrl_c: _CtrlC) -> NotebookRun:
    """Run one notebook of ``plan`` in a fresh kernel, with its progress bar; store what it produced."""
    start = time.perf_counter()
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # not a notebook (corrupt JSON, wrong schema): name it, go on
        return NotebookRun(path.stem, False, 0.0, None, f"cannot be read: {_last_line(str(err))}")
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    # A shipped notebook's runs are recorded in the output folder; the ledger shipped beside it is a fallback.
    ledgers = (plan.ledger_dir, path.parent) if plan.shipped else (plan.ledger_dir,)
    bar = CellProgress.for_notebook(ledgers, path.stem, quick=plan.quick, cells=n_code, enabled=plan.progress)
    env = plan.kernel_env_for(path.stem)
    try:
        failed_cell, error = _execute(nb, plan.kernel_dir, plan.timeout, env, bar.cell_done, ctrl_c.press)
    except KeyboardInterrupt:
        ctrl_c.pressed, failed_cell, error = True, None, None
    finally:
        ctrl_c.rearm()
    bar.close()
    if ctrl_c.pressed:
        error = "interrupted (Ctrl-C)"
    run = NotebookRun(
        path.stem,
        error is None,
        time.perf_counter() - start,
        failed_cell,
        error,
        failed_cell_label=cell_label(nb, failed_cell),
        interrupted=ctrl_c.pressed,
    )
    _store(plan, path, nb, run, bar.seconds)
    return run


def _store(plan: RunPlan, path: Path, nb, run: NotebookRun, cell_seconds: list[float]) -> None:
    """Record a clean run's time, write the executed copy, and with ``refresh`` the notebook itself.

    A write that fails (a full disk, a read-only folder) fails this notebook's run, naming the file, and the run
    goes on to the next notebook and the summary: every write is atomic, so nothing half-written is left.
    """
    try:
        _store_files(plan, path, nb, run, cell_seconds)
    except OSError as err:
        run.ok = False
        run.error = f"could not write {getattr(err, 'filename', None) or 'its outputs'}: {err.strerror or err}"


def _store_files(plan: RunPlan, path: Path, nb, run: NotebookRun, cell_seconds: list[float]) -> None:
    if run.ok:
        # With --refresh (or --record-times) the ledger beside the notebooks: what the title cell's run-time line
        # reads on --refresh; else the output folder's, so that a plain run leaves the checkout clean.
        record_run_time(
            plan.ledger_dir, path.stem, quick=plan.quick, seconds=run.seconds, machine=plan.machine, cells=cell_seconds
        )
    _write_notebook(nb, plan.executed_dir / path.name)
    if run.ok and plan.refresh:
        run.problems = hygiene_problems(nb)
        if run.problems:
            run.ok = False
            run.error = "outputs not stored: " + "; ".join(run.problems[:5])
        else:
            stamp_run_time(nb, run_time_line(path.parent, path.stem))
            _write_notebook(nb, path)


def write_summary(
    out_dir: Path, runs: Sequence[NotebookRun], *, quick: bool, json_only: bool = False
) -> tuple[Path, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.html`` from the run's records; returns (md, json).

    The HTML page (``out_dir/summary.html``) is drawn from the same document as ``summary.json``;
    ``json_only`` writes ``summary.json`` alone.
    """
    env = dataclasses.replace(describe(), quick_mode=quick)  # the mode the notebooks ran in
    statuses = [
        NotebookStatus(r.name, r.ok, round(r.seconds, 2), r.failed_cell_label, r.error, r.finished_at, r.carried_over)
        for r in runs
    ]
    problems: list[str] = []
    records = load_records(out_dir / "records.jsonl", problems)
    return write_summary_files(out_dir, env, statuses, records, json_only=json_only, problems=problems)
