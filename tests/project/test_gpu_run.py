"""The prepared GPU run (benchmarks/gpu_run.py), dry-run on a CPU so that it cannot rot between GPU runs."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_run.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_run  # noqa: E402
from tiny_notebooks import write_nb  # noqa: E402


def _notebooks(folder: Path) -> Path:
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
    return folder


def _run(args, **env):
    full_env = {**os.environ, "TRICKS_DEVICE": "cpu", **env}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=600
    )


@pytest.mark.slow
def test_dry_run_runs_every_phase_and_stamps_the_machine(tmp_path):
    notebooks, out = _notebooks(tmp_path / "nbs"), tmp_path / "out"
    done = _run(["--dry-run", "--notebooks", str(notebooks), "--out", str(out), "--full", "20", "--budget", "300"])
    assert done.returncode == 0, done.stderr + done.stdout
    # Each notebook's elapsed time is printed as it ends, in both phases.
    assert "10_fast:" in done.stdout and done.stdout.count("20_device:") == 2
    quick = json.loads((out / "quick" / "summary.json").read_text())
    assert quick["mode"] == "quick" and [s["notebook"] for s in quick["notebooks"]] == ["10_fast", "20_device"]
    assert [m["trick"] for m in quick["measurements"]] == ["noop"]  # the first notebook's row survived the second
    full = json.loads((out / "full" / "summary.json").read_text())
    assert full["mode"] == "full" and [s["notebook"] for s in full["notebooks"]] == ["20_device"]
    stamp = json.loads((out / "machine.json").read_text())
    assert stamp["gpu"] is None and stamp["torch"] and stamp["describe"]["cuda_available"] is False
    with tarfile.open(out / "notebooks.tar.gz") as tar:
        assert {"quick/10_fast.ipynb", "quick/20_device.ipynb", "full/20_device.ipynb"} <= set(tar.getnames())
    # Few files come back from a device run: the executed notebooks travel in the tarball only.
    assert not (out / "quick" / "notebooks").exists()


@pytest.mark.slow  # starts fresh Python processes
def test_without_a_gpu_it_refuses_unless_dry_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = _run(["--notebooks", str(tmp_path), "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
    done = _run(["--dry-run", "--notebooks", str(tmp_path), "--out", str(tmp_path / "o")], TRICKS_DEVICE="")
    assert done.returncode == 2 and "TRICKS_DEVICE=cpu" in done.stderr


def test_the_full_mode_plan_names_notebooks_that_exist():
    stems = [p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")]
    for number in gpu_run.GPU_CLAIM_NOTEBOOKS:
        assert any(s.startswith(number) for s in stems), number


def test_results_folder_is_named_after_the_gpu():
    assert gpu_run.device_slug({"gpu": "NVIDIA H200", "describe": {}}) == "nvidia-h200"
    assert gpu_run.device_slug({"gpu": None, "describe": {"device_name": "Tesla T4"}}) == "tesla-t4"
