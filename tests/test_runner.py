"""The main command: runs notebooks headless, summarizes records, names the failing cell."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from test_summary_html import parse_page

from tricks_lib.__main__ import main
from tricks_lib.report.notebook_source import NotebookSource, find_notebooks, hygiene_problems, locate_notebooks
from tricks_lib.report.runner import run_notebooks, write_summary

KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def write_nb(path, *sources):
    cells = [new_markdown_cell("# test")] + [new_code_cell(s) for s in sources]
    nbformat.write(new_notebook(cells=cells, metadata=KERNELSPEC), path)


@pytest.fixture
def notebooks(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_nb(
        folder / "10_ok.ipynb",
        "from tricks_lib.env import quick_mode\nfrom tricks_lib import measure\nfrom tricks_lib.report.results import record",
        "record('noop', measure(lambda: None, min_run_time=0.01, device='cpu'))\nquick_mode()",
    )
    write_nb(
        folder / "15_env.ipynb",
        "import os\nos.environ.get('CUBLAS_WORKSPACE_CONFIG')",
    )
    write_nb(folder / "20_fails.ipynb", "x = 1", "raise RuntimeError('boom')", "y = 2")
    return folder


def test_find_notebooks_selects_by_prefix(notebooks):
    assert [p.stem for p in find_notebooks(notebooks)] == ["10_ok", "15_env", "20_fails"]
    assert [p.stem for p in find_notebooks(notebooks, ["20"])] == ["20_fails"]
    with pytest.raises(ValueError, match="matches no notebook"):
        find_notebooks(notebooks, ["99"])
    with pytest.raises(ValueError, match="no notebooks"):
        find_notebooks(notebooks / "empty_missing")


@pytest.mark.slow
def test_run_records_summary_and_refresh(notebooks, tmp_path):
    out = tmp_path / "out"
    runs = run_notebooks(find_notebooks(notebooks, ["10"]), out, quick=True, refresh=True, progress=False)
    assert [r.ok for r in runs] == [True]
    refreshed = nbformat.read(notebooks / "10_ok.ipynb", as_version=4)
    last = refreshed.cells[-1]
    assert last.execution_count == 2
    assert last.outputs[0]["data"]["text/plain"] == "True"  # the kernel saw quick mode
    md, js = write_summary(out, runs, quick=True)
    summary = json.loads(js.read_text())
    assert summary["mode"] == "quick"
    assert [m["trick"] for m in summary["measurements"]] == ["noop"]
    assert summary["measurements"][0]["notebook"] == "10_ok"
    assert "## 10_ok" in md.read_text() and "| noop |" in md.read_text()
    assert (out / "notebooks" / "10_ok.ipynb").exists()


@pytest.mark.slow
def test_kernels_start_with_cublas_configured_for_determinism(notebooks, tmp_path, monkeypatch):
    # cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, at the first cuBLAS call: setting it inside a cell
    # is too late once any matmul ran, so the kernel must inherit it.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    out = tmp_path / "out"
    runs = run_notebooks(find_notebooks(notebooks, ["15"]), out, quick=True, progress=False)
    assert runs[0].ok
    executed = nbformat.read(out / "notebooks" / "15_env.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["data"]["text/plain"] == "':4096:8'"
    import os

    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # the caller's environment is restored


def test_summary_shows_compile_costs(tmp_path, monkeypatch):
    from tricks_lib.compiling import CompileCost
    from tricks_lib.report.results import record
    from tricks_lib.report.runner import NotebookRun

    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    cost = CompileCost(9.0, 2.0, 1.5, 12.0, 5.0, compiled=lambda: None, namespace={"DEVICE": "cpu"})
    record("compile", cost, notebook="02")
    md, js = write_summary(tmp_path, [NotebookRun("02", True, 1.0)], quick=True)
    variants = {m["variant"]: m["median_s"] for m in json.loads(js.read_text())["measurements"]}
    assert variants == {"first call, empty caches": 9.0, "first call, warm on-disk cache": 2.0, "import torch": 1.5}
    assert "first call, empty caches | 9 s" in md.read_text()


@pytest.mark.slow
def test_failure_names_notebook_and_cell(notebooks, tmp_path, capsys):
    code = main(
        ["run", "--quick", "--only", "20", "--notebooks", str(notebooks), "--out", str(tmp_path / "o"), "--no-progress"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED: 20_fails.ipynb, cell 3 of 4 (code cell 2: `raise RuntimeError('boom')`)" in err
    assert "RuntimeError: boom" in err and "\x1b[" not in err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["notebooks"][0]["failed_cell"].startswith("cell 3 of 4")
    # a failed notebook is never written back in place
    assert all(
        c.get("outputs", []) == []
        for c in nbformat.read(notebooks / "20_fails.ipynb", 4).cells
        if c.cell_type == "code"
    )


@pytest.mark.slow
def test_cell_timeout_is_enforced(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    write_nb(folder / "30_slow.ipynb", "import time\ntime.sleep(60)")
    runs = run_notebooks(find_notebooks(folder), tmp_path / "out", quick=True, timeout=2, progress=False)
    assert not runs[0].ok and "Timeout" in runs[0].error
    assert runs[0].seconds < 45


@pytest.mark.slow
def test_unreadable_notebook_is_reported_not_fatal(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    (folder / "40_broken.ipynb").write_text("{not json")
    write_nb(folder / "50_fine.ipynb", "1 + 1")
    runs = run_notebooks(find_notebooks(folder), tmp_path / "out", quick=True, progress=False)
    assert [(r.name, r.ok) for r in runs] == [("40_broken", False), ("50_fine", True)]
    assert "cannot be read" in runs[0].error


def test_hygiene_flags_errors_and_local_paths(tmp_path):
    nb = new_notebook(cells=[new_code_cell("x")])
    nb.cells[0].execution_count = 1
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"saved to {tmp_path}/x.bin\n")]
    assert any("local path" in p for p in hygiene_problems(nb))
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="E", evalue="v", traceback=[])]
    assert any("error output" in p for p in hygiene_problems(nb))
    nb.cells[0].execution_count = None
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="fine\n")]
    assert any("execution count" in p for p in hygiene_problems(nb))


def test_cli_argument_errors(tmp_path, capsys):
    assert main(["run", "--timeout", "0", "--notebooks", str(tmp_path)]) == 2
    assert main(["run", "--notebooks", str(tmp_path)]) == 2
    assert "no notebooks" in capsys.readouterr().err


def test_out_pointing_at_a_file_is_a_clear_error(notebooks, tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("not a folder")
    assert main(["run", "--quick", "--notebooks", str(notebooks), "--out", str(target), "--no-progress"]) == 2
    assert "is a file" in capsys.readouterr().err and target.read_text() == "not a folder"


@pytest.mark.slow
def test_a_subset_run_merges_into_the_earlier_run_and_says_so(notebooks, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    common = ["--quick", "--notebooks", str(notebooks), "--out", str(out), "--no-progress"]
    assert main(["run", *common, "--only", "10", "15"]) == 0
    first = json.loads((out / "summary.json").read_text())
    assert [m["trick"] for m in first["measurements"]] == ["noop"]
    capsys.readouterr()
    # Re-running only 15 keeps 10's row and status (stamped as kept), instead of dropping them.
    assert main(["run", *common, "--only", "15"]) == 0
    assert "Summary merged: 10_ok kept from the earlier run" in capsys.readouterr().err
    merged = json.loads((out / "summary.json").read_text())
    assert [m["trick"] for m in merged["measurements"]] == ["noop"]
    by_name = {s["notebook"]: s for s in merged["notebooks"]}
    assert by_name["10_ok"]["carried_over"] is True and by_name["15_env"]["carried_over"] is False
    first_10 = next(s for s in first["notebooks"] if s["notebook"] == "10_ok")
    assert by_name["10_ok"]["finished_at"] == first_10["finished_at"]
    assert "(earlier run, kept)" in (out / "summary.md").read_text()
    # summary.html follows the merged summary.json: a section per notebook it lists, the kept one marked.
    page = parse_page((out / "summary.html").read_text())
    assert page.sections == [f"nb-{s['notebook']}" for s in merged["notebooks"]] == ["nb-10_ok", "nb-15_env"]
    assert "(earlier run, kept)" in " ".join(page.text) and "noop" in " ".join(page.text)
    # A full-mode run of a subset does not merge into a quick-mode folder: it replaces it, and says so.
    monkeypatch.setenv("TRICKS_QUICK", "0")
    assert main(["run", "--notebooks", str(notebooks), "--out", str(out), "--no-progress", "--only", "15"]) == 0
    assert "Summary replaced: the earlier run" in capsys.readouterr().err
    replaced = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in replaced["notebooks"]] == ["15_env"] and replaced["measurements"] == []
    page = parse_page((out / "summary.html").read_text())
    assert page.sections == ["nb-15_env"] and "noop" not in " ".join(page.text)


@pytest.mark.slow
def test_ctrl_c_stops_the_run_marks_the_rest_interrupted_and_exits_130(tmp_path, capsys):
    folder = tmp_path / "nbs"
    folder.mkdir()
    # The cell sends Ctrl-C to the runner (its parent), as a terminal would to the whole group.
    write_nb(
        folder / "60_ctrl_c.ipynb", "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(30)"
    )
    write_nb(folder / "70_next.ipynb", "1 + 1")
    out = tmp_path / "out"
    code = main(["run", "--quick", "--notebooks", str(folder), "--out", str(out), "--no-progress"])
    assert code == 130
    summary = json.loads((out / "summary.json").read_text())
    assert [(n["notebook"], n["ok"], n["error"]) for n in summary["notebooks"]] == [
        ("60_ctrl_c", False, "interrupted (Ctrl-C)"),
        ("70_next", False, "interrupted: not run"),
    ]
    assert summary["notebooks"][0]["seconds"] < 25  # stopped, not waiting out the cell


def test_a_bad_quick_value_is_one_line_not_a_traceback(notebooks, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRICKS_QUICK", "maybe")
    assert main(["run", "--notebooks", str(notebooks), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: TRICKS_QUICK='maybe' is not understood") and "Traceback" not in err


def test_run_help_describes_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "executed notebooks and a summary" in capsys.readouterr().out


def test_stored_notebooks_carry_the_standard_kernelspec():
    from pathlib import Path

    from tricks_lib.report.runner import STANDARD_KERNELSPEC

    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        assert json.loads(path.read_text())["metadata"]["kernelspec"] == STANDARD_KERNELSPEC, path.name


def test_without_the_run_extra_the_main_command_names_the_install(notebooks, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "tricks_lib.report.runner")
    monkeypatch.setitem(sys.modules, "nbformat", None)  # as on a core install: no Jupyter stack
    assert main(["run", "--notebooks", str(notebooks), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "nbformat is missing" in err and "pip install 'tricks_lib[run]'" in err


def test_describe_prints_cpu_flags_readably(capsys):
    assert main(["describe"]) == 0
    lines = {line.split(":", 1)[0].strip(): line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "(" not in lines["cpu_flags"] and "'" not in lines["cpu_flags"]


def _as_an_installed_package(monkeypatch, shipped):
    """This process's tricks_lib, seen as a wheel install that ships ``shipped`` (no checkout around it)."""
    import tricks_lib.report.notebook_source as source

    monkeypatch.setattr(source, "_checkout_notebook_dir", lambda: None)
    monkeypatch.setattr(source, "shipped_notebook_dir", lambda: shipped.resolve())


def test_notebooks_are_found_where_given_then_in_the_checkout_then_in_the_installed_package(
    notebooks, tmp_path, monkeypatch
):
    from pathlib import Path

    assert locate_notebooks(notebooks) == NotebookSource(notebooks, "--notebooks")
    here = locate_notebooks()
    assert (here.origin, here.folder) == ("checkout", Path(__file__).resolve().parents[1] / "notebooks")
    with pytest.raises(ValueError, match="not a folder"):
        locate_notebooks(tmp_path / "missing")
    _as_an_installed_package(monkeypatch, notebooks)
    shipped = locate_notebooks()
    assert shipped.shipped and shipped.origin == "installed package" and shipped.folder == notebooks.resolve()
    _as_an_installed_package(monkeypatch, tmp_path / "nothing_shipped")
    with pytest.raises(ValueError, match="pass --notebooks DIR"):
        locate_notebooks()


def test_dry_run_lists_the_notebooks_and_where_they_were_found_and_runs_none(notebooks, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["run", "--dry-run", "--quick", "--notebooks", str(notebooks), "--out", str(out), "--only", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Notebooks: {notebooks} (--notebooks)"
    assert lines[1] == f"Would run 2 notebook(s) in quick mode -> {out}/"
    assert [line.split()[0] for line in lines[2:]] == ["10_ok", "15_env"]
    assert all(line.endswith("no quick run recorded") for line in lines[2:]) and not out.exists()


def test_the_installed_package_s_notebooks_are_never_refreshed(notebooks, tmp_path, monkeypatch, capsys):
    _as_an_installed_package(monkeypatch, notebooks)
    assert main(["run", "--refresh", "--quick", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "installed package's copy" in capsys.readouterr().err
    with pytest.raises(ValueError, match="run it in a clone"):
        run_notebooks(find_notebooks(notebooks, ["10"]), tmp_path / "o", quick=True, refresh=True, progress=False)


@pytest.mark.slow
def test_shipped_notebooks_run_in_the_output_folder_and_record_their_times_there(notebooks, tmp_path, monkeypatch):
    write_nb(notebooks / "16_cwd.ipynb", "import os\nos.getcwd()")
    _as_an_installed_package(monkeypatch, notebooks)
    before = sorted(p.name for p in notebooks.iterdir())
    out = tmp_path / "out"
    runs = run_notebooks(find_notebooks(notebooks, ["16"]), out, quick=True, progress=False)
    assert runs[0].ok, runs[0].error
    executed = nbformat.read(out / "notebooks" / "16_cwd.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["data"]["text/plain"] == repr(str((out / "notebooks").resolve()))
    assert "16_cwd" in json.loads((out / "run_times.json").read_text())
    assert sorted(p.name for p in notebooks.iterdir()) == before  # nothing written beside the shipped copies
