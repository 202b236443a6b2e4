"""The prepared GPU run: every notebook on CUDA, within a time budget, results stamped with the GPU.

On a machine with a CUDA GPU and this checkout (no Jupyter, no network needed):

    python benchmarks/gpu_run.py --wheels .whl --out OUT

1. installs the carried wheels (Jupyter's kernel stack and the optional libraries) into a private
   folder, never into the machine's environment;
2. runs every notebook in quick mode (``OUT/quick/``), then the notebooks whose claims are GPU claims
   in full mode (``OUT/full/``, in the order of ``--full``) while the budget allows, printing the
   elapsed time of each notebook as it ends;
3. writes ``OUT/machine.json`` (GPU name, driver, CUDA, cuDNN, torch) and ``OUT/notebooks.tar.gz``
   (the executed notebooks), next to each phase's ``summary.md`` and ``summary.json``.

Beforehand, on a machine with a network: ``python benchmarks/gpu_run.py --download-wheels .whl``
fetches those wheels for the GPU machine's Python (3.12, x86-64 Linux).

``TRICKS_DEVICE=cpu python benchmarks/gpu_run.py --dry-run ...`` runs the same steps on a CPU (the
tests do, so the script cannot rot between GPU runs); without ``--dry-run`` it refuses a machine
that has no GPU, since its results would be filed as GPU results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The notebooks whose claims are GPU claims (cuDNN autotuning, AMP, channels_last, pinned copies,
# the allocator, determinism's cost, the capstone's ladder), most quoted first.
GPU_CLAIM_NOTEBOOKS = ("02", "03", "08", "07", "01", "05")
# Planning only (never reported): a full-mode notebook takes about this many times its quick run.
FULL_OVER_QUICK = 4.0
# What the GPU machine lacks (its image has torch, torchvision, numpy, matplotlib, Pillow, OpenCV,
# h5py, onnx, onnxruntime, scikit-learn, tqdm, pytest): Jupyter's kernel stack and our optional parts.
WHEELS = (
    "nbclient nbformat jupyter_client jupyter_core ipykernel traitlets pyzmq tornado comm debugpy "
    "nest_asyncio platformdirs fastjsonschema jsonschema jsonschema-specifications referencing rpds-py "
    "ipython ipython_pygments_lexers decorator jedi parso matplotlib-inline pexpect ptyprocess "
    "prompt_toolkit wcwidth stack_data asttokens executing pure_eval "
    "webdataset braceexpand lmdb tfrecord crc32c simplejpeg torchao torch-pruning"
).split()


def download_wheels(folder: Path) -> int:
    """Fetch the wheels the GPU machine needs (run where a package registry is reachable)."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version=3.12"]
    command += ["--implementation=cp", *platforms, "--platform=manylinux2014_x86_64", "--platform=any", "-d"]
    failed = []
    for name in WHEELS:  # one at a time, so one missing wheel names itself instead of stopping the rest
        if subprocess.run([*command, str(folder), name], capture_output=True).returncode != 0:
            failed.append(name)
    print(f"{len(WHEELS) - len(failed)} of {len(WHEELS)} wheels in {folder}; failed: {failed or 'none'}")
    return 1 if failed else 0


def install_wheels(folder: Path, target: Path) -> None:
    """Install the carried wheels into ``target`` and make this process and its kernels see them."""
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"error: no wheels in {folder}; make them with --download-wheels {folder}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
        + ["--no-cache-dir", "--target", str(target), *wheels],
        check=True,
    )
    _prepend_path(target)


def _prepend_path(folder: Path) -> None:
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def machine_stamp() -> dict:
    """GPU name, driver, CUDA, cuDNN and torch versions, and describe()'s fields."""
    import torch

    from tricks_lib.env import describe

    stamp = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "describe": describe().to_dict(),
    }
    try:
        query = "--query-gpu=name,driver_version,memory.total"
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        name, driver, memory = (s.strip() for s in out.stdout.splitlines()[0].split(","))
        stamp.update(gpu=name, driver=driver, gpu_memory=memory)
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        stamp.update(gpu=None, driver=None, gpu_memory=None)  # no nvidia-smi: a CPU dry run
    return stamp


def device_slug(stamp: dict) -> str:
    """The folder name of a GPU's results, e.g. 'nvidia-h200' (``results/gpu/<slug>/``)."""
    name = stamp.get("gpu") or stamp["describe"]["device_name"] or "unknown"
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def _run_phase(paths, out: Path, *, quick: bool, deadline: float, cell_timeout: int) -> list:
    from tricks_lib.report.runner import run_notebooks, write_summary

    runs = []
    for path in paths:
        left = deadline - time.monotonic()
        if left < 30:
            print(f"  {path.stem}: not run, the budget is spent", flush=True)
            continue
        # The runner merges one notebook at a time into the phase's summary (same mode, same machine).
        merged = run_notebooks([path], out, quick=quick, timeout=int(min(cell_timeout, left)), progress=False)
        write_summary(out, merged, quick=quick)
        this = next(r for r in merged if r.name == path.stem)
        runs.append(this)
        status = "ok" if this.ok else f"FAILED: {this.describe_failure()}"
        print(f"  {path.stem}: {this.seconds:.1f} s, {status}", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output folder")
    parser.add_argument("--wheels", type=Path, help="folder of carried wheels to install first")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    parser.add_argument("--full", nargs="*", default=list(GPU_CLAIM_NOTEBOOKS), help="notebooks to rerun in full mode")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="folder of notebooks")
    parser.add_argument("--cell-timeout", type=int, default=300, help="seconds one cell may run (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="allow a machine without a GPU (TRICKS_DEVICE=cpu)")
    parser.add_argument("--download-wheels", type=Path, metavar="DIR", help="only fetch the wheels into DIR")
    args = parser.parse_args(argv)
    if args.download_wheels:
        return download_wheels(args.download_wheels)
    if args.out is None or args.budget <= 0:
        parser.error("--out is required and --budget must be positive")
    start = time.monotonic()
    deadline = start + args.budget
    if args.wheels:
        install_wheels(args.wheels, Path(os.environ.get("TMPDIR", "/tmp")) / "tricks-gpu-site")
    _prepend_path(ROOT)  # tricks_lib from this checkout, for this process and the kernels
    import torch

    if not torch.cuda.is_available():
        if not args.dry_run:
            print("error: no CUDA GPU here; this run files GPU results (use --dry-run on a CPU)", file=sys.stderr)
            return 2
        if os.environ.get("TRICKS_DEVICE") != "cpu":
            print("error: a dry run needs TRICKS_DEVICE=cpu, so that no notebook looks for a GPU", file=sys.stderr)
            return 2
    from tricks_lib.report.notebook_source import find_notebooks

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = machine_stamp()
    (args.out / "machine.json").write_text(json.dumps(stamp, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"GPU run on {stamp.get('gpu') or 'the CPU (dry run)'}, budget {args.budget:.0f} s", flush=True)

    paths = find_notebooks(args.notebooks)
    print("quick mode, every notebook:", flush=True)
    quick_runs = _run_phase(paths, args.out / "quick", quick=True, deadline=deadline, cell_timeout=args.cell_timeout)
    quick_seconds = {r.name: r.seconds for r in quick_runs}
    print("full mode, the GPU claims:", flush=True)
    chosen = find_notebooks(args.notebooks, args.full) if args.full else []
    chosen.sort(key=lambda p: args.full.index(next(s for s in args.full if p.stem.startswith(s))))
    full = []
    for path in chosen:  # skip what would not fit, try the next (smaller ones may)
        estimate = FULL_OVER_QUICK * quick_seconds.get(path.stem, args.budget)
        if time.monotonic() + estimate > deadline:
            print(f"  {path.stem}: skipped, about {estimate:.0f} s would not fit the budget", flush=True)
            continue
        full += _run_phase([path], args.out / "full", quick=False, deadline=deadline, cell_timeout=args.cell_timeout)

    with tarfile.open(args.out / "notebooks.tar.gz", "w:gz") as tar:
        for phase in ("quick", "full"):
            folder = args.out / phase / "notebooks"
            if folder.is_dir():
                tar.add(folder, arcname=phase)
                shutil.rmtree(folder)  # the tarball holds them; the device tool brings back few files
    elapsed = time.monotonic() - start
    failed = [r.name for r in quick_runs + full if not r.ok]
    print(f"done in {elapsed:.0f} s; results for {device_slug(stamp)}; failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
