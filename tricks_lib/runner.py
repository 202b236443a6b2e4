"""The main job: execute the notebooks headless on this machine and summarize every measurement.

``python -m tricks_lib run`` runs each notebook in a fresh kernel of this interpreter (nbclient),
writes the executed notebooks and a summary (Markdown and JSON) into an output folder, and fails
naming the notebook and cell that broke. ``--refresh`` also stores the outputs back into
``notebooks/`` (after checking them for errors and local paths), which is the only way the stored
outputs are meant to change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager

from tricks_lib.env import QUICK_ENV_VAR, describe
from tricks_lib.results import NOTEBOOK_ENV_VAR, RESULTS_ENV_VAR, Record, load_records

__all__ = ["NotebookRun", "find_notebooks", "local_path_pattern", "run_notebooks", "write_summary"]

CURRENT_ENV_KERNEL = "python3"


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
    failed_cell: int | None = None  # index among all cells of the notebook
    error: str | None = None
    problems: list[str] = field(default_factory=list)  # hygiene problems that blocked a refresh

    def describe_failure(self) -> str:
        where = f"cell {self.failed_cell}" if self.failed_cell is not None else "before any cell ran"
        return f"{self.name}.ipynb, {where}: {self.error}"


def find_notebooks(notebook_dir: Path, only: Sequence[str] | None = None) -> list[Path]:
    """The notebooks to run, in order; ``only`` selects by number or name prefix ("03", "03_memory").

    Raises:
        ValueError: the folder holds no notebooks, or a selector matches none.
    """
    paths = sorted(p for p in notebook_dir.glob("*.ipynb") if not p.name.startswith("."))
    if not paths:
        raise ValueError(f"no notebooks found in {notebook_dir}; run from the repository root or pass --notebooks")
    if not only:
        return paths
    chosen = []
    for selector in only:
        matches = [p for p in paths if p.stem == selector or p.stem.startswith(selector)]
        if not matches:
            raise ValueError(f"--only {selector!r} matches no notebook; choose from {[p.stem for p in paths]}")
        chosen += [p for p in matches if p not in chosen]
    return sorted(chosen)


def local_path_pattern() -> re.Pattern:
    """Paths that must never appear in stored outputs: this checkout, home, temp, the interpreter."""
    roots = {str(Path.cwd().resolve().parent), str(Path.home()), tempfile.gettempdir(), "/tmp", sys.prefix}
    roots = {r.rstrip("/") for r in roots if r and r != "/"}
    alternatives = "|".join(re.escape(r) + "/" for r in sorted(roots, key=len, reverse=True))
    return re.compile(f"({alternatives}|/home/|/root/)")


def _output_texts(output: dict) -> list[str]:
    texts = []
    if "text" in output:
        texts.append("".join(output["text"]) if isinstance(output["text"], list) else output["text"])
    for key, value in output.get("data", {}).items():
        if key.startswith("text/") or key == "application/json":
            texts.append(value if isinstance(value, str) else json.dumps(value))
    if output.get("output_type") == "error":
        texts.extend(output.get("traceback", []))
    return texts


def hygiene_problems(nb) -> list[str]:
    """Reasons a notebook's outputs may not be stored: error outputs, missing counts, local paths."""
    problems = []
    leak = local_path_pattern()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.outputs and cell.execution_count is None:
            problems.append(f"cell {index}: outputs without an execution count")
        for output in cell.outputs:
            if output.get("output_type") == "error":
                problems.append(f"cell {index}: an error output ({output.get('ename')})")
            for text in _output_texts(output):
                match = leak.search(text)
                if match:
                    problems.append(f"cell {index}: a local path in an output ({match.group(0)}...)")
                    break
    return problems


def _execute(path: Path, timeout: int, on_cell: Callable[[], None]) -> tuple[object, int | None, str | None]:
    """Run one notebook; returns (executed notebook, failed cell index or None, error text or None)."""
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    failed: dict[str, int] = {}
    # IPC sockets in a private folder: no TCP ports to collide on a shared machine, no network at all.
    ipc_dir = tempfile.mkdtemp(prefix="tricks-kernel-")
    km = KernelManager(
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
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_executed=lambda cell, cell_index, execute_reply: on_cell(),
        on_cell_error=lambda cell, cell_index, execute_reply: failed.setdefault("index", cell_index),
        on_cell_start=lambda cell, cell_index: failed.__setitem__("running", cell_index),
    )
    try:
        client.execute()
    except CellExecutionError as err:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        return nb, failed.get("index", failed.get("running")), lines[-1] if lines else "cell failed"
    except (CellTimeoutError, DeadKernelError) as err:
        return nb, failed.get("running"), f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
    finally:
        # We own the kernel manager, so nbclient leaves the kernel running: stop it here.
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        shutil.rmtree(ipc_dir, ignore_errors=True)
    return nb, None, None


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
    back in place. Records from ``tricks_lib.results.record`` land in ``out_dir/records.jsonl``.
    """
    from tqdm.auto import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    executed_dir = out_dir / "notebooks"
    executed_dir.mkdir(exist_ok=True)
    records_path = out_dir / "records.jsonl"
    records_path.write_text("", encoding="utf-8")
    saved_env = {k: os.environ.get(k) for k in (QUICK_ENV_VAR, RESULTS_ENV_VAR, NOTEBOOK_ENV_VAR)}
    runs = []
    try:
        os.environ[QUICK_ENV_VAR] = "1" if quick else "0"
        os.environ[RESULTS_ENV_VAR] = str(records_path.resolve())
        for path in paths:
            os.environ[NOTEBOOK_ENV_VAR] = path.stem
            n_code = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
            bar = tqdm(total=n_code, desc=path.stem, unit="cell", disable=not progress, leave=True)
            start = time.perf_counter()
            nb, failed_cell, error = _execute(path, timeout, lambda: bar.update(1))
            bar.close()
            run = NotebookRun(path.stem, error is None, time.perf_counter() - start, failed_cell, error)
            nbformat.write(nb, executed_dir / path.name)
            if run.ok and refresh:
                run.problems = hygiene_problems(nb)
                if run.problems:
                    run.ok = False
                    run.error = "outputs not stored: " + "; ".join(run.problems[:5])
                else:
                    nbformat.write(nb, path)
            runs.append(run)
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return runs


def _fmt_time(seconds: float | None) -> str:
    from tricks_lib.bench import format_seconds

    return "-" if seconds is None else format_seconds(seconds)


def _summary_rows(records: Sequence[Record]) -> list[dict]:
    rows = []
    for rec in records:
        for row in rec.rows:
            memory = row.get("memory") or (row if rec.kind == "memory" else {})
            rows.append(
                {
                    "notebook": rec.notebook,
                    "trick": rec.trick,
                    "variant": row.get("variant") or row.get("label"),
                    "median_s": row.get("median_s"),
                    "iqr_s": row.get("iqr_s"),
                    "speedup": row.get("speedup"),
                    "verdict": row.get("verdict"),
                    "saved_bytes": memory.get("saved_bytes"),
                    "peak_allocated_bytes": memory.get("peak_allocated_bytes"),
                    "device": rec.device,
                }
            )
    return rows


def write_summary(out_dir: Path, runs: Sequence[NotebookRun], *, quick: bool) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``summary.md`` from the run's records; returns both paths."""
    from tricks_lib.memory import format_bytes

    env = dataclasses.replace(describe(), quick_mode=quick)  # the mode the notebooks ran in
    records = load_records(out_dir / "records.jsonl")
    rows = _summary_rows(records)
    summary = {
        "machine": env.to_dict(),
        "machine_summary": env.summary(),
        "mode": "quick" if quick else "full",
        "notebooks": [
            {"notebook": r.name, "ok": r.ok, "seconds": round(r.seconds, 2), "failed_cell": r.failed_cell,
             "error": r.error}
            for r in runs
        ],
        "measurements": rows,
    }
    json_path = out_dir / "summary.json"
    json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")

    lines = [
        "# PyTorch Tricks: measured on this machine",
        "",
        f"{env.summary()}",
        "",
        "| notebook | status | run time |",
        "|---|---|---|",
    ]
    lines += [f"| {r.name} | {'ok' if r.ok else 'FAILED: ' + (r.error or '')} | {r.seconds:.1f} s |" for r in runs]
    lines += [
        "",
        "| notebook | trick | variant | median | IQR | speedup | verdict | saved for backward | peak allocated | device |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if isinstance(r["speedup"], (int, float)) else "-"
        lines.append(
            f"| {r['notebook']} | {r['trick']} | {r['variant']} | {_fmt_time(r['median_s'])} | "
            f"{_fmt_time(r['iqr_s'])} | {speedup} | {r['verdict'] or '-'} | {format_bytes(r['saved_bytes'])} | "
            f"{format_bytes(r['peak_allocated_bytes'])} | {r['device']} |"
        )
    md_path = out_dir / "summary.md"
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md_path, json_path
