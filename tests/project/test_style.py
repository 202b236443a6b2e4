"""One dialect everywhere: ruff's lint and format checks ([tool.ruff] in pyproject.toml) pass."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ["tricks_lib", "tests", "benchmarks", "conftest.py"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *CHECKED], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} found:\n{result.stdout}{result.stderr}\nfix: ruff {command[0]} {' '.join(CHECKED)}"
    )
