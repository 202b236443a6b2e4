"""Colab, simulated: the setup cell installs tricks_lib without touching the kernel it runs in.

Colab comes with torch, torchvision and its own Jupyter stack (ipykernel, jupyter_client), pinned to
each other; upgrading any of them can crash the runtime. Here a fresh virtual environment sees this
machine's packages as Colab's preinstalled ones (its site-packages folder on the path, without the
editable install of this checkout that a ``.pth`` hook there adds), a fake ``google.colab``
module makes the cell take its Colab branch, and the cell installs from this checkout (``git+file://``
in place of the GitHub address). Nothing preinstalled may be reinstalled or upgraded.
"""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_STACK = ("torch", "torchvision", "ipykernel", "jupyter_client", "ipython", "numpy")

RUN_CELL = """
import json, sys
import google.colab  # as Colab's kernel does at start-up: the cell checks sys.modules for it
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
result = shell.run_cell(open(sys.argv[1]).read())
print(json.dumps({"ok": result.success, "error": repr(result.error_in_exec or result.error_before_exec)}))
"""

VERSIONS = """
import importlib.metadata as md, json
names = {names!r}
print(json.dumps({{n: [md.version(n), str(md.distribution(n).locate_file(''))] for n in names}}))
"""


def _setup_sources() -> set[str]:
    return {
        "".join(json.loads(p.read_text())["cells"][1]["source"])
        for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    }


@pytest.mark.slow
def test_setup_cell_on_colab_upgrades_nothing_colab_preinstalled(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("needs the checkout to be a git repository (the cell installs it with git+file://)")
    env_dir = tmp_path / "colab"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    system_site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    venv_site = next((env_dir / "lib").glob("python3*/site-packages"))
    # A plain path line: the folder's packages are importable, but its own .pth hooks do not run.
    (venv_site / "colab_preinstalled.pth").write_text(system_site + "\n")
    fake = tmp_path / "fake"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "__init__.py").write_text("")
    (fake / "google" / "colab" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(fake), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    def versions():
        code = VERSIONS.format(names=KERNEL_STACK)
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
        return json.loads(done.stdout)

    # Run from outside the checkout, so that `import tricks_lib` cannot come from the working directory.
    probe = subprocess.run([python, "-c", "import tricks_lib"], capture_output=True, env=env, cwd=tmp_path)
    assert probe.returncode != 0, "the simulated Colab must start without tricks_lib"
    before = versions()
    for index, source in enumerate(sorted(_setup_sources())):
        cell = tmp_path / f"setup_{index}.py"
        repo_line = next(line for line in source.splitlines() if line.startswith("REPOSITORY = "))
        cell.write_text(source.replace(repo_line, f'REPOSITORY = "file://localhost{ROOT}"'))
        done = subprocess.run(
            [python, "-c", RUN_CELL, str(cell)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["ok"], outcome["error"] + done.stdout[-2000:]
    after = versions()
    assert after == before, {n: (before[n], after[n]) for n in KERNEL_STACK if before[n] != after[n]}
    installed = subprocess.run(
        [python, "-c", "import tricks_lib; print(tricks_lib.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert str(env_dir) in installed.stdout, installed.stdout + installed.stderr
