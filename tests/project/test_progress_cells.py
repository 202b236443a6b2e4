"""Long cells show progress (issue 16, item 8): every code cell that took more than
LONG_CELL_SECONDS in the last recorded full-mode run shows a progress bar, and no checked cell does
(its stored output is compared, and a bar's text changes from run to run)."""

import json
from pathlib import Path

import pytest

from tricks_lib.report.run_times import LEDGER_NAME

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LONG_CELL_SECONDS = 20.0
SHOWS_PROGRESS = ("progress=True", "tqdm(", "progress_bar(", "progress=PROGRESS")


def _notebooks():
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_cells_longer_than_20_s_in_full_mode_show_progress(path):
    ledger = json.loads((NOTEBOOKS / LEDGER_NAME).read_text(encoding="utf-8"))
    full = ledger.get(path.stem, {}).get("full")
    if not full or "cells" not in full:
        pytest.skip(f"no full-mode cell times recorded for {path.stem} yet")
    code = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    # The ledger holds each code cell's seconds, written by the same run that stores the notebook.
    assert len(full["cells"]) == len(code), "run_times.json is from another version of this notebook"
    silent = [
        (_source(cell).splitlines()[0][:60], round(seconds))
        for cell, seconds in zip(code, full["cells"])
        if seconds > LONG_CELL_SECONDS and not any(mark in _source(cell) for mark in SHOWS_PROGRESS)
    ]
    assert not silent, f"code cells (first line, seconds) with no progress bar: {silent}"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_no_checked_cell_shows_a_progress_bar(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    bad = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        and _source(cell).startswith("# NBVAL_CHECK_OUTPUT")
        and any(mark in _source(cell) for mark in SHOWS_PROGRESS)
    ]
    assert not bad, f"checked cells with a progress bar: {bad}"
