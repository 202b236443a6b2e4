"""The prepared GPU run (benchmarks/gpu_run.py), dry-run on a CPU so that it cannot rot between GPU runs."""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_run.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_run  # noqa: E402
from tiny_notebooks import write_nb  # noqa: E402


def _notebooks(folder: Path, *, slow_seconds: int = 0) -> Path:
    folder.mkdir()
    write_nb(
        folder / "10_fast.ipynb",
        "from tricks_lib import measure\nfrom tricks_lib.report.results import record\n"
        "record('noop', measure(lambda: None, min_run_time=0.01, device='cpu'))",
        title="# 10_fast",
    )
    write_nb(
        folder / "20_device.ipynb",
        "from tricks_lib.env import pick_device\nassert pick_device().type == 'cpu'",
        title="# 20_device",
    )
    if slow_seconds:
        write_nb(folder / "30_slow.ipynb", f"import time\ntime.sleep({slow_seconds})", title="# 30_slow")
    ledger = {stem: {"quick": {"seconds": 1.0}, "full": {"seconds": 2.0}} for stem in ("10_fast", "20_device")}
    (folder / "run_times.json").write_text(json.dumps(ledger))
    return folder


def _run(args, **env):
    full_env = {**os.environ, "TRICKS_DEVICE": "cpu", **env}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=600
    )


def _archive(out: Path) -> dict:
    """name -> bytes of every file in the run's archive."""
    with tarfile.open(out / gpu_run.ARCHIVE) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.slow
def test_dry_run_runs_every_phase_into_one_archive_and_few_files(tmp_path):
    notebooks, out = _notebooks(tmp_path / "nbs"), tmp_path / "out"
    ledger_before = (notebooks / "run_times.json").read_text()
    args = ["--dry-run", "--notebooks", str(notebooks), "--out", str(out), "--full", "20", "--budget", "300"]
    done = _run([*args, "--tests-budget", "0"])
    assert done.returncode == 0, done.stderr + done.stdout
    # Each notebook's elapsed time is printed as it ends, in both phases, with the full-mode estimate.
    assert "10_fast:" in done.stdout and done.stdout.count("20_device:") == 2 and "(estimated" in done.stdout
    assert len(list(out.iterdir())) <= gpu_run.MAX_OUTPUT_FILES
    assert sorted(p.name for p in out.iterdir()) == [gpu_run.ARCHIVE, "machine.json", "progress.txt"]
    files = _archive(out)
    quick = json.loads(files["gpu_results/quick/summary.json"])
    assert quick["mode"] == "quick" and [s["notebook"] for s in quick["notebooks"]] == ["10_fast", "20_device"]
    assert [m["trick"] for m in quick["measurements"]] == ["noop"]  # the first notebook's row survived the second
    full = json.loads(files["gpu_results/full/summary.json"])
    assert full["mode"] == "full" and [s["notebook"] for s in full["notebooks"]] == ["20_device"]
    # The per-cell times of this machine come back, and the checkout's (CPU) ledger is left as it was.
    assert "10_fast" in json.loads(files["gpu_results/quick/run_times.json"])
    assert (notebooks / "run_times.json").read_text() == ledger_before
    assert {"gpu_results/quick/notebooks/10_fast.ipynb", "gpu_results/full/notebooks/20_device.ipynb"} <= set(files)
    stamp = json.loads(files["gpu_results/machine.json"])
    assert stamp["gpu"] is None and stamp["torch"] and stamp["describe"]["cuda_available"] is False
    assert b"done in" in files["gpu_results/progress.txt"]


@pytest.mark.slow
def test_the_deadline_holds_with_a_slow_notebook_and_the_archive_keeps_what_finished(tmp_path):
    notebooks, out = _notebooks(tmp_path / "nbs", slow_seconds=600), tmp_path / "out"
    began = time.monotonic()
    args = ["--dry-run", "--notebooks", str(notebooks), "--out", str(out), "--full", "10", "--budget", "60"]
    done = _run([*args, "--tests-budget", "0"])
    assert time.monotonic() - began < 60 + 30, "the deadline was not kept"
    assert done.returncode == 1 and "30_slow:" in done.stdout and "stopped at the deadline" in done.stdout
    quick = json.loads(_archive(out)["gpu_results/quick/summary.json"])
    status = {s["notebook"]: s for s in quick["notebooks"]}
    assert status["10_fast"]["ok"] and status["20_device"]["ok"]
    assert not status["30_slow"]["ok"] and status["30_slow"]["error"].startswith("did not finish")
    assert "would not fit" in done.stdout or "budget is spent" in done.stdout  # no full run after the deadline


@pytest.mark.slow  # starts fresh Python processes
def test_without_a_gpu_it_refuses_unless_dry_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = _run(["--notebooks", str(tmp_path), "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
    done = _run(["--dry-run", "--notebooks", str(tmp_path), "--out", str(tmp_path / "o")], TRICKS_DEVICE="")
    assert done.returncode == 2 and "TRICKS_DEVICE=cpu" in done.stderr


def test_full_mode_estimates_come_from_the_ledgers_own_ratio():
    ledger = {"02_training": {"quick": {"seconds": 50.0}, "full": {"seconds": 400.0}}, "03_memory": {"full": {}}}
    assert gpu_run.full_over_quick(ledger, "02_training") == 8.0
    assert gpu_run.full_over_quick(ledger, "03_memory") is None and gpu_run.full_over_quick(ledger, "x") is None
    shipped = json.loads((ROOT / "notebooks" / "run_times.json").read_text())
    assert all(gpu_run.full_over_quick(shipped, p.stem) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_wheels_go_into_a_private_folder_made_for_the_run(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_run.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(gpu_run, "_prepend_path", lambda folder: None)
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"")
    first, second = gpu_run.install_wheels(tmp_path), gpu_run.install_wheels(tmp_path)
    assert first != second and (first.stat().st_mode & 0o777) == 0o700
    assert calls[0][calls[0].index("--target") + 1] == str(first)


def test_the_full_mode_plan_names_notebooks_that_exist():
    stems = [p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")]
    for number in gpu_run.GPU_CLAIM_NOTEBOOKS:
        assert any(s.startswith(number) for s in stems), number
    assert all((ROOT / t).exists() for t in gpu_run.GPU_TESTS)


def test_results_folder_is_named_after_the_gpu():
    assert gpu_run.device_slug({"gpu": "NVIDIA H200", "describe": {}}) == "nvidia-h200"
    assert gpu_run.device_slug({"gpu": None, "describe": {"device_name": "Tesla T4"}}) == "tesla-t4"
