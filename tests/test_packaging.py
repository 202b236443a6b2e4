"""Set-up promises: pip and conda list the same dependencies; CI runs the README's test command;
stored notebooks carry a real run's outputs."""

import json
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


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


def test_readme_lists_every_notebook_with_a_colab_badge():
    readme = (ROOT / "README.md").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{nb.name}" in readme, f"README does not list {nb.name}"
        assert re.search(rf"colab\.research\.google\.com/github/.+/notebooks/{re.escape(nb.name)}", readme), nb.name


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_stored_notebook_has_outputs_of_a_real_run(path):
    import nbformat

    from tricks_lib.runner import hygiene_problems

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
        assert 'raise RuntimeError(f"Installing tricks_lib from {REPOSITORY} failed' in setup, path.name
