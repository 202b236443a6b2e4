"""Set-up promises: pip and conda list the same dependencies; CI runs the README's test command;
stored notebooks carry a real run's outputs."""

import json
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _normalize(requirement: str) -> str:
    name, rest = re.match(r"([A-Za-z0-9_.\-]+)(.*)", requirement.strip()).groups()
    return re.sub(r"[-_.]+", "-", name).lower() + rest.replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["dependencies"])
    for reqs in project["optional-dependencies"].values():
        declared |= {r for r in reqs if not r.startswith("tricks_lib")}
    conda_pip = set()
    in_pip = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.strip() == "- pip:":
            in_pip = True
            continue
        m = re.match(r"\s{6}- (\S+)", line)
        if in_pip and m:
            conda_pip.add(m.group(1))
    assert {_normalize(r) for r in declared} == {_normalize(r) for r in conda_pip}


def test_no_hard_pins():
    text = (ROOT / "pyproject.toml").read_text() + (ROOT / "environment.yml").read_text()
    assert "==" not in text


def _readme_commands():
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```(?:bash|sh)\n(.*?)```", readme, flags=re.S)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    blocks = [b.strip() for b in _readme_commands()]
    assert ci in blocks, f"the README has no code block that is exactly CI's command: {ci}"
    assert "pytest" in ci and "pip install" in ci


def test_readme_main_command_runs_all_notebooks():
    blocks = [b.strip() for b in _readme_commands()]
    assert any("pip install" in b and "python -m tricks_lib run" in b for b in blocks)


def test_the_readmes_main_job_cost_is_the_ledgers():
    """The README's figures about the main job come from notebooks/run_times.json, not from memory."""
    from tricks_lib.report.run_times import main_job_cost

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert main_job_cost(ROOT / "notebooks") in readme, "rewrite the README's cost sentence from main_job_cost()"


def test_readme_lists_every_notebook_with_a_colab_badge():
    readme = (ROOT / "README.md").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{nb.name}" in readme, f"README does not list {nb.name}"
        assert re.search(rf"colab\.research\.google\.com/github/.+/notebooks/{re.escape(nb.name)}", readme), nb.name


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_has_outputs_of_a_real_run(path):
    import nbformat

    from tricks_lib.report.notebook_source import hygiene_problems

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "stored without running every cell"
    assert hygiene_problems(nb) == []
    first = code[0].outputs[0]
    text = json.dumps(first.get("data", first.get("text", "")))
    assert "torch" in text and "threads" in text, "the first output must name the machine (describe())"


def _repository() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def test_badges_and_setup_cells_use_the_one_repository_address():
    repo = _repository()
    owner_name = repo.removeprefix("https://github.com/")
    badges = re.findall(r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/", (ROOT / "README.md").read_text())
    assert badges and set(badges) == {owner_name}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        setup = "".join(json.loads(path.read_text())["cells"][1]["source"])
        assert f'REPOSITORY = "{repo}"' in setup, path.name
        assert "git+{REPOSITORY}" in setup and "github.com" not in setup.replace(f'"{repo}"', ""), path.name
        # A failed install ends in one sentence that names the address, not a bare ModuleNotFoundError.
        assert 'raise RuntimeError(f"pip could not install tricks_lib from {REPOSITORY}' in setup, path.name


def test_the_wheel_lists_every_subpackage_and_ships_the_notebooks():
    # The packages are listed (a mapped folder is not found by packages.find): a new subpackage of
    # tricks_lib/ that is not listed here would be missing from every wheel.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tricks_lib").rglob("__init__.py")} - {""}
    assert set(setuptools["packages"]) == on_disk | {"tricks_lib.notebooks"}
    assert setuptools["package-dir"] == {"tricks_lib.notebooks": "notebooks"}
    assert setuptools["package-data"]["tricks_lib.notebooks"] == ["*.ipynb", "run_times.json"]


@pytest.mark.slow
def test_an_installed_wheel_finds_its_notebooks_from_anywhere(tmp_path):
    # Build a wheel from a copy of the checkout (the build writes build/ and egg-info beside the sources),
    # install it into a bare folder, and ask the main command, from elsewhere, what it would run.
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("tricks_lib", "notebooks"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(wheels)], check=True)
    (wheel,) = wheels.glob("tricks_lib-*.whl")
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    shipped = sorted(
        n.removeprefix("tricks_lib/notebooks/") for n in zipfile.ZipFile(wheel).namelist() if "/notebooks/" in n
    )
    assert shipped == sorted([*notebooks, "run_times.json"])
    modules = {p.relative_to(source).as_posix() for p in (source / "tricks_lib").rglob("*.py")}
    assert modules <= set(zipfile.ZipFile(wheel).namelist())  # every module, in every subpackage
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "TRICKS_QUICK": "1"}

    def main_command(*args):
        return subprocess.run(
            [sys.executable, "-m", "tricks_lib", "run", *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    listing = main_command("--dry-run", "--out", "results")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == f"Notebooks: {(site / 'tricks_lib' / 'notebooks').resolve()} (installed package)"
    assert lines[1] == f"Would run {len(notebooks)} notebook(s) in quick mode -> results/"
    assert [line.split()[0] for line in lines[2:-1]] == [n.removesuffix(".ipynb") for n in notebooks]
    assert lines[-1].startswith("Expected: ")  # the total of the recorded times
    assert any("last quick run" in line for line in lines[2:])  # the shipped ledger came along
    refused = main_command("--refresh", "--only", "00", "--out", "results")
    assert refused.returncode == 2 and "installed package's copy" in refused.stderr
    assert sorted(os.listdir(elsewhere)) == []  # neither listing nor refusing wrote anything


def test_the_readmes_own_code_example_runs_against_the_package_root(monkeypatch, tmp_path):
    # "Using tricks_lib in your own code" imports from the root: the example must keep working as written.
    monkeypatch.setenv("TRICKS_QUICK", "1")
    monkeypatch.delenv("TRICKS_RESULTS", raising=False)
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Using `tricks_lib` in your own code") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "from tricks_lib import compare, describe, measure, measure_memory" in block
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["table"]["no_grad"].outcome.value in ("faster", "slower", "not significant")


def test_the_readme_starts_with_the_quick_run_and_its_cost_from_the_ledger():
    from tricks_lib.report.run_times import main_job_cost

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    readme = " ".join(text.split())
    assert main_job_cost(ROOT / "notebooks", mode="quick") in readme, "rewrite the quick-run cost from main_job_cost()"
    assert text.index("python -m tricks_lib run --quick") < text.index("python -m tricks_lib run\n")
    assert (ROOT / "CONTRIBUTING.md").exists() and "CONTRIBUTING.md" in text


def test_the_readmes_every_trick_example_runs(monkeypatch):
    # "Every trick on your own model": the two calls as the README writes them, on a smaller batch and budget.
    monkeypatch.setenv("TRICKS_QUICK", "1")
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Every trick on your own model") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    block = block.replace("budget_s=60", "budget_s=8, tricks=['channels_last']").replace(
        "budget_s=30", "budget_s=4, tricks=['no_grad']"
    )
    block = block.replace("torch.randn(8, 3, 64, 64)", "torch.randn(2, 3, 32, 32)").replace("(8,))", "(2,))")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert [r.name for r in namespace["report"].rows] == ["channels_last"]
