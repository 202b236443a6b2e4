"""The run-time ledger and the title cell's run-time line (tricks_lib.report.run_times)."""

import json
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from runner_fixtures import shared_run_once

from tricks_lib.formatting import format_seconds
from tricks_lib.report.run_times import (
    LEDGER_NAME,
    MARKER,
    main_job_cost,
    record_run_time,
    run_time_line,
    stamp_run_time,
)


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """One run of tiny notebooks (runner_fixtures), shared by every test that only reads what it wrote."""
    return shared_run_once(tmp_path_factory)


def test_the_line_reads_what_was_recorded_per_mode(tmp_path):
    assert run_time_line(tmp_path, "02_training") is None
    record_run_time(tmp_path, "02_training", quick=True, seconds=41.23, machine="CPU only: X")
    record_run_time(tmp_path, "02_training", quick=False, seconds=312.0, machine="CPU only: X")
    line = run_time_line(tmp_path, "02_training")
    assert line.startswith(MARKER)
    assert "as the main command last recorded it on CPU only: X: quick mode 41.2 s" in line
    assert "full mode 312 s" in line
    # Another machine's full run: each mode names its own machine.
    record_run_time(tmp_path, "02_training", quick=False, seconds=60.0, machine="NVIDIA H200")
    line = run_time_line(tmp_path, "02_training")
    assert "quick mode 41.2 s on CPU only: X" in line and "full mode 60 s on NVIDIA H200" in line
    assert json.loads((tmp_path / LEDGER_NAME).read_text())["02_training"]["full"]["seconds"] == 60.0
    with pytest.raises(ValueError, match="run time"):
        record_run_time(tmp_path, "02_training", quick=True, seconds=float("nan"), machine="x")


def test_the_main_job_cost_reads_the_full_runs_of_the_ledger(tmp_path):
    for name, seconds in (("00_a", 40.0), ("01_b", 1190.0), ("02_c", 379.0), ("03_d", 186.0)):
        record_run_time(tmp_path, name, quick=False, seconds=seconds, machine="CPU only: X")
    record_run_time(tmp_path, "04_e", quick=True, seconds=9999.0, machine="CPU only: X")  # quick runs do not count
    assert main_job_cost(tmp_path) == (
        f"29.9 min for the 4 notebooks (full mode, recorded {time.strftime('%Y-%m-%d', time.gmtime())} on CPU only: X), most of it "
        "01 (19.8 min) and 02 (6.3 min); the others take 40 s to 3.1 min each"
    )
    with pytest.raises(ValueError, match="full-mode runs"):
        main_job_cost(tmp_path / "empty")


def test_stamping_replaces_the_earlier_line_and_keeps_the_title():
    nb = new_notebook(cells=[new_markdown_cell("# 02 · Training\n\nIntro."), new_code_cell("x = 1")])
    stamp_run_time(nb, f"{MARKER}\n*Run time: quick mode 1 s.*")
    stamp_run_time(nb, f"{MARKER}\n*Run time: quick mode 2 s.*")
    assert nb.cells[0].source == f"# 02 · Training\n\nIntro.\n\n{MARKER}\n*Run time: quick mode 2 s.*"
    stamp_run_time(nb, None)
    assert nb.cells[0].source == "# 02 · Training\n\nIntro."
    nbformat.validate(nb)


@pytest.mark.slow
def test_refresh_writes_the_recorded_time_into_the_title_cell(shared_run):
    # The shared run refreshed 10_ok (runner_fixtures): its title cell now says what the run took.
    title = nbformat.read(shared_run.notebooks / "10_ok.ipynb", as_version=4).cells[0].source
    recorded = json.loads((shared_run.notebooks / LEDGER_NAME).read_text())["10_ok"]["quick"]
    assert title.startswith("# 10 · OK") and f"quick mode {format_seconds(recorded['seconds'])}" in title
    assert title == f"# 10 · OK\n\n{run_time_line(shared_run.notebooks, '10_ok')}"
    assert len(recorded["cells"]) == 2  # one time per code cell, for the next run's progress bar


def test_cell_times_are_kept_for_the_next_progress_bar(tmp_path):
    from tricks_lib.report.run_times import recorded_cell_seconds

    record_run_time(tmp_path, "01_data", quick=False, seconds=100.0, machine="m", cells=[0.5, 90.0, 9.5])
    assert recorded_cell_seconds(tmp_path, "01_data", quick=False, cells=3) == [0.5, 90.0, 9.5]
    # A notebook with another number of code cells changed since: no weights, the bar counts cells.
    assert recorded_cell_seconds(tmp_path, "01_data", quick=False, cells=4) is None
    assert recorded_cell_seconds(tmp_path, "01_data", quick=True, cells=3) is None
