"""The prepared GPU run: the GPU unit tests and every notebook on CUDA, inside one deadline, results in one archive.

On a machine with a CUDA GPU and this checkout (no Jupyter, no network needed):

    python benchmarks/gpu_run.py --wheels .whl --out OUT --budget 540

1. installs the carried wheels (Jupyter's kernel stack and the optional libraries) into a private
   folder made for this run (never into the machine's environment, never a fixed shared path);
2. runs the GPU unit tests (``pytest -o addopts=""``: the GPU machine has no nbval);
3. runs every notebook in quick mode, then the notebooks whose claims are GPU claims in full mode (in the
   order of ``--full``) while the deadline allows: a notebook starts only when its estimate fits (its
   quick time on this GPU times the full/quick ratio the CPU ledger recorded for it), and each runs in
   its own process group, stopped at the deadline (its summary then says it did not finish);
4. after each step rewrites ``OUT/gpu_results.tar.gz``: the executed notebooks, each phase's summary
   (``summary.md``/``.json``/``.html``), records and run times (``run_times.json``: the per-cell GPU times),
   the test log and ``machine.json`` (GPU name, driver, CUDA, cuDNN, torch). A run cut at the device's
   time limit keeps everything up to its last finished step.

``OUT`` ends with at most ``MAX_OUTPUT_FILES`` files (the device returns 8): the archive, ``machine.json`` and
``progress.txt`` (what this script printed). The work happens in a temporary folder beside it.

Beforehand, on a machine with a network: ``python benchmarks/gpu_run.py --download-wheels .whl``
fetches those wheels for the GPU machine's Python (3.12, x86-64 Linux).

``TRICKS_DEVICE=cpu python benchmarks/gpu_run.py --dry-run ...`` runs the same steps on a CPU (the
tests do, so the script cannot rot between GPU runs); without ``--dry-run`` it refuses a machine
that has no GPU, since its results would be filed as GPU results. ``--plan`` prints the plan only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The notebooks whose claims are GPU claims (AMP, channels_last, cuDNN autotuning, the allocator, the
# capstone's ladder, determinism's cost, pinned copies, lower precision, PyTorch 2's CUDA graphs, float8 and
# allocator switches), most quoted first.
GPU_CLAIM_NOTEBOOKS = ("02", "03", "08", "07", "01", "05", "10")
# The unit tests that exercise CUDA (they skip themselves on a CPU).
GPU_TESTS = ("tests/test_gpu_capabilities.py", "tests/test_memory.py", "tests/test_comparing.py", "tests/test_env.py")
MAX_OUTPUT_FILES = 8  # what the device machine brings back
ARCHIVE = "gpu_results.tar.gz"
MARGIN_S = 20  # seconds kept free before the deadline for the last archive
# What the GPU machine lacks (its image has torch, torchvision, numpy, matplotlib, Pillow, OpenCV,
# h5py, onnx, onnxruntime, scikit-learn, tqdm, pytest): Jupyter's kernel stack and our optional parts.
WHEELS = (
    "nbclient nbformat jupyter_client jupyter_core ipykernel traitlets pyzmq tornado comm debugpy "
    "nest_asyncio platformdirs fastjsonschema jsonschema jsonschema-specifications referencing rpds-py "
    "ipython ipython_pygments_lexers decorator jedi parso matplotlib-inline pexpect ptyprocess "
    "prompt_toolkit wcwidth stack_data asttokens executing pure_eval "
    "webdataset braceexpand lmdb tfrecord crc32c simplejpeg torchao torch-pruning torchdata"
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


def install_wheels(folder: Path) -> Path:
    """Install the carried wheels into a new private folder (mode 0700, made for this run: another user cannot
    plant a ``sitecustomize.py`` there) and make this process and its children see them; returns the folder."""
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"error: no wheels in {folder}; make them with --download-wheels {folder}")
    target = Path(tempfile.mkdtemp(prefix="tricks-gpu-site-"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
        + ["--no-cache-dir", "--target", str(target), *wheels],
        check=True,
    )
    _prepend_path(target)
    return target


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


def full_over_quick(ledger: dict, stem: str) -> float | None:
    """The full/quick run-time ratio the CPU ledger recorded for notebook ``stem`` (None: not both recorded)."""
    try:
        return float(ledger[stem]["full"]["seconds"]) / float(ledger[stem]["quick"]["seconds"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


class Run:
    """The run's clock, its work folder, its log and its archive."""

    def __init__(self, out: Path, budget: float):
        self.out, self.start, self.deadline = out, time.monotonic(), time.monotonic() + budget
        self.work = Path(tempfile.mkdtemp(prefix="tricks-gpu-run-"))
        self.log_path = out / "progress.txt"
        self.log_path.write_text("", encoding="utf-8")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, line: str) -> None:
        print(line, flush=True)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(line + "\n")

    def archive(self) -> None:
        """Rewrite OUT/gpu_results.tar.gz from the work folder and the log, atomically (temporary name, rename)."""
        partial = self.out / f".{ARCHIVE}.partial"
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(self.work, arcname="gpu_results")
            tar.add(self.log_path, arcname="gpu_results/progress.txt")
            if (self.out / "machine.json").exists():
                tar.add(self.out / "machine.json", arcname="gpu_results/machine.json")
        os.replace(partial, self.out / ARCHIVE)

    def child(
        self, command: list[str], *, timeout: float, log_name: str, env: dict | None = None
    ) -> tuple[int | None, float]:
        """Run ``command`` in its own process group, its output into the work folder; stop the whole group at
        ``timeout`` (a hung rank or a compile's grandchild goes too). (exit code or None when stopped, seconds)."""
        began = time.monotonic()
        with (self.work / log_name).open("ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env
            )
            try:
                return proc.wait(timeout=max(1.0, timeout)), time.monotonic() - began
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None, time.monotonic() - began


def run_notebook(run: Run, notebooks: Path, stem: str, *, quick: bool, cell_timeout: int) -> tuple[str, float]:
    """One notebook through the main command (merging into its phase's summary); ('ok'|'failed'|'stopped', s)."""
    phase = "quick" if quick else "full"
    timeout = run.left() - MARGIN_S
    command = [sys.executable, "-m", "tricks_lib", "run", "--notebooks", str(notebooks), "--only", stem]
    command += ["--out", str(run.work / phase), "--no-progress", "--timeout", str(int(min(cell_timeout, timeout)))]
    env = os.environ | {"TRICKS_QUICK": "1" if quick else "0"}  # the phase's mode, whatever the caller's was
    code, seconds = run.child(
        command + (["--quick"] if quick else []), timeout=timeout, log_name=f"{phase}.log", env=env
    )
    status = "stopped at the deadline" if code is None else "ok" if code == 0 else f"failed (exit {code})"
    return status, seconds


def run_tests(run: Run, limit: float) -> str:
    """The GPU unit tests, without the notebook options of pyproject's addopts (the GPU machine has no nbval)."""
    command = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", *GPU_TESTS]
    code, seconds = run.child(command, timeout=min(limit, run.left() - MARGIN_S), log_name="tests.log")
    return f"{'stopped' if code is None else 'passed' if code == 0 else f'failed (exit {code})'} in {seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output folder (at most 8 files land there)")
    parser.add_argument("--wheels", type=Path, help="folder of carried wheels to install first")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run (default 540)")
    parser.add_argument("--full", nargs="*", default=list(GPU_CLAIM_NOTEBOOKS), help="notebooks to rerun in full mode")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="folder of notebooks")
    parser.add_argument("--cell-timeout", type=int, default=300, help="seconds one cell may run (default 300)")
    parser.add_argument("--tests-budget", type=float, default=90.0, help="seconds for the GPU unit tests (0: skip)")
    parser.add_argument("--dry-run", action="store_true", help="allow a machine without a GPU (TRICKS_DEVICE=cpu)")
    parser.add_argument("--download-wheels", type=Path, metavar="DIR", help="only fetch the wheels into DIR")
    args = parser.parse_args(argv)
    if args.download_wheels:
        return download_wheels(args.download_wheels)
    if args.out is None or args.budget <= 0:
        parser.error("--out is required and --budget must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.budget)
    if args.wheels:
        run.say(f"wheels installed into {install_wheels(args.wheels)}")
    _prepend_path(ROOT)  # tricks_lib from this checkout, for this process and its children
    import torch

    if not torch.cuda.is_available():
        if not args.dry_run:
            print("error: no CUDA GPU here; this run files GPU results (use --dry-run on a CPU)", file=sys.stderr)
            return 2
        if os.environ.get("TRICKS_DEVICE") != "cpu":
            print("error: a dry run needs TRICKS_DEVICE=cpu, so that no notebook looks for a GPU", file=sys.stderr)
            return 2
    from tricks_lib.report.notebook_source import find_notebooks

    stamp = machine_stamp()
    (args.out / "machine.json").write_text(json.dumps(stamp, indent=2, default=str) + "\n", encoding="utf-8")
    run.say(f"GPU run on {stamp.get('gpu') or 'the CPU (dry run)'}, budget {args.budget:.0f} s")
    if args.tests_budget > 0:
        run.say(f"GPU unit tests: {run_tests(run, args.tests_budget)}")
        run.archive()
    ledger_path = args.notebooks / "run_times.json"
    ledger = json.loads(ledger_path.read_text(encoding="utf-8")) if ledger_path.exists() else {}
    failed, quick_seconds = [], {}
    run.say("quick mode, every notebook:")
    for path in find_notebooks(args.notebooks):
        if run.left() < MARGIN_S + 10:
            run.say(f"  {path.stem}: not run, the budget is spent")
            continue
        status, seconds = run_notebook(run, args.notebooks, path.stem, quick=True, cell_timeout=args.cell_timeout)
        quick_seconds[path.stem] = seconds
        failed += [f"quick {path.stem}"] if status != "ok" else []
        run.say(f"  {path.stem}: {seconds:.1f} s, {status}")
        run.archive()
    run.say("full mode, the GPU claims:")
    chosen = []  # in the order of --full, most quoted claims first
    for selector in args.full:
        chosen += [p for p in find_notebooks(args.notebooks, [selector]) if p not in chosen]
    for path in chosen:
        ratio = full_over_quick(ledger, path.stem)
        if path.stem not in quick_seconds or ratio is None:
            run.say(f"  {path.stem}: skipped, no quick time here or no full/quick ratio recorded")
            continue
        estimate = quick_seconds[path.stem] * ratio
        if estimate > run.left() - MARGIN_S:  # skip what would not fit, try the next (smaller ones may)
            run.say(f"  {path.stem}: skipped, about {estimate:.0f} s ({ratio:.1f}x its quick run) would not fit")
            continue
        status, seconds = run_notebook(run, args.notebooks, path.stem, quick=False, cell_timeout=args.cell_timeout)
        failed += [f"full {path.stem}"] if status != "ok" else []
        run.say(f"  {path.stem}: {seconds:.1f} s (estimated {estimate:.0f} s), {status}")
        run.archive()
    run.say(
        f"done in {time.monotonic() - run.start:.0f} s; results for {device_slug(stamp)} in {args.out / ARCHIVE}; "
        f"failed or stopped: {failed or 'none'}"
    )
    run.archive()
    shutil.rmtree(run.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
