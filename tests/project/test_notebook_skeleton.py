"""Every notebook has the same skeleton, so a reader finds the same things in the same places.

Numbered title; the setup cell (Colab install, CUBLAS_WORKSPACE_CONFIG); one imports-and-config cell
tagged ``parameters``; numbered sections; "Verdicts on this machine" (built with VerdictTable);
"Exercises" last. No helper is defined in two notebooks (they belong in tricks_lib).
"""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def cells_of(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell):
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_skeleton(path):
    cells = cells_of(path)
    number = path.stem[:2]
    title, setup, config = cells[0], cells[1], cells[2]
    assert title["cell_type"] == "markdown" and source(title).startswith(f"# {number} · "), "first cell: '# NN · Title'"
    assert setup["cell_type"] == "code" and source(setup).startswith("# Setup"), "second cell: the setup cell"
    assert 'os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG"' in source(setup), "setup sets CUBLAS_WORKSPACE_CONFIG"
    assert config["cell_type"] == "code" and "parameters" in config["metadata"].get("tags", []), (
        "third cell: imports and configuration, tagged 'parameters'"
    )
    assert re.search(r"^(import |from )", source(config), re.M), "the parameters cell holds the imports"
    assert sum("parameters" in c["metadata"].get("tags", []) for c in cells) == 1, "one parameters cell"
    headings = [
        source(c).splitlines()[0] for c in cells if c["cell_type"] == "markdown" and source(c).startswith("## ")
    ]
    assert any(re.match(r"## \d+\. ", h) for h in headings), "numbered sections '## 1. ...'"
    assert headings[-2:] == ["## Verdicts on this machine", "## Exercises"], headings[-3:]
    verdict_at = next(i for i, c in enumerate(cells) if source(c).startswith("## Verdicts on this machine"))
    # The table is a VerdictTable, filled where each trick is measured (or in the section itself); the
    # section shows it.
    code = [source(c) for c in cells if c["cell_type"] == "code"]
    tables = {name for c in code for name in re.findall(r"^(\w+) = VerdictTable\(", c, re.M)}
    assert tables, "the closing table is a tricks_lib.report.verdicts.VerdictTable"
    shown = [c for c in cells[verdict_at:] if c["cell_type"] == "code"]
    assert any(re.search(rf"^(display\()?({'|'.join(tables)})\)?\s*(#.*)?$", source(c), re.M) for c in shown), (
        f"the verdicts section shows the closing table ({sorted(tables)})"
    )


def test_no_helper_is_defined_in_two_notebooks():
    from notebook_measures import measure_notebooks

    assert measure_notebooks(ROOT / "notebooks")["defined_in_more_than_one_notebook"] == {}
