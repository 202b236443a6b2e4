"""The main command: runs notebooks headless, summarizes records, names the failing cell.

The plan of a run (``plan_run``) is tested without kernels. The tests that only read what a run
wrote share one run (``runner_fixtures.shared_run``); a test that needs a run of its own (a timeout,
Ctrl-C, the shipped copies, a run on top of the shared one) starts only the kernels it needs.
"""

import ast
import dataclasses
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from runner_fixtures import shared_run_once
from test_summary_html import parse_page
from tiny_notebooks import KERNEL_VARS, write_env, write_fails, write_nb, write_ok

from tricks_lib.__main__ import main
from tricks_lib.env import describe
from tricks_lib.report.notebook_source import NotebookSource, find_notebooks, hygiene_problems, locate_notebooks
from tricks_lib.report.runner import NotebookRun, plan_run, run_notebooks, write_summary


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """One run of tiny notebooks (runner_fixtures), shared by every test that only reads what it wrote."""
    return shared_run_once(tmp_path_factory)


@pytest.fixture
def notebooks(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_ok(folder)
    write_env(folder)
    write_fails(folder)
    return folder


def test_find_notebooks_selects_by_prefix(notebooks):
    assert [p.stem for p in find_notebooks(notebooks)] == ["10_ok", "15_env", "20_fails"]
    assert [p.stem for p in find_notebooks(notebooks, ["20"])] == ["20_fails"]
    assert [p.stem for p in find_notebooks(notebooks, ["15_e", "010"])] == ["10_ok", "15_env"]
    with pytest.raises(ValueError, match="matches no notebook"):
        find_notebooks(notebooks, ["99"])
    with pytest.raises(ValueError, match="matches no notebook"):
        find_notebooks(notebooks, ["1"])  # a number is one notebook's number, never a prefix of several
    for name in ("a_one", "a_two"):
        (notebooks / f"{name}.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="matches 2 notebooks"):
        find_notebooks(notebooks, ["a_"])
    with pytest.raises(ValueError, match="no notebooks"):
        find_notebooks(notebooks / "empty_missing")


# --- the plan: decided before anything runs, without kernels -------------------------------------


def test_the_plan_holds_the_mode_the_paths_and_the_kernel_environment(notebooks, tmp_path):
    out = tmp_path / "out"
    paths = find_notebooks(notebooks)
    for quick, mode, flag in ((True, "quick", "1"), (False, "full", "0")):
        plan = plan_run(paths, out, quick=quick, timeout=7, progress=False, environ={})
        assert (plan.quick, plan.mode, plan.refresh, plan.timeout, plan.progress) == (quick, mode, False, 7, False)
        assert plan.notebooks == tuple(paths) and plan.source == NotebookSource(notebooks, "--notebooks")
        assert plan.out_dir == out and plan.executed_dir == out / "notebooks"
        assert plan.records == (out / "records.jsonl").resolve() and plan.records.is_absolute()
        assert plan.kernel_dir == notebooks and plan.ledger_dir == out and not plan.shipped  # a plain run: --out
        assert plan_run(paths, out, quick=quick, record_times=True).ledger_dir == notebooks
        assert dict(plan.kernel_env) == {
            "TRICKS_QUICK": flag,
            "TRICKS_RESULTS": str(plan.records),
            "TRICKS_PROGRESS": "0",  # the runner shows one bar per notebook; the cells' bars stay off
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS needs it from the kernel's start
        }
        env = plan.kernel_env_for("15_env")
        assert env["TRICKS_NOTEBOOK"] == "15_env" and env["TRICKS_RESULTS"] == str(plan.records)
        assert "TRICKS_NOTEBOOK" not in plan.kernel_env  # one notebook's name never leaks into the next
        assert plan.earlier is None and not plan.merge and plan.replace_reason is None
    assert not out.exists()  # planning writes nothing
    # A cuBLAS configuration the caller chose is the one the kernels get; the environment defaults to ours.
    assert (
        plan_run(paths, out, quick=True, environ={"CUBLAS_WORKSPACE_CONFIG": ":16:8"}).kernel_env[
            "CUBLAS_WORKSPACE_CONFIG"
        ]
        == ":16:8"
    )
    assert plan_run(paths, out, quick=True).kernel_env["CUBLAS_WORKSPACE_CONFIG"] == os.environ.get(
        "CUBLAS_WORKSPACE_CONFIG", ":4096:8"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.quick = True
    with pytest.raises(TypeError):
        plan.kernel_env["TRICKS_QUICK"] = "1"
    with pytest.raises(ValueError, match="one folder at a time"):
        plan_run([notebooks / "10_ok.ipynb", tmp_path / "elsewhere" / "11_x.ipynb"], out, quick=True)


def test_the_plan_refreshes_a_checkout_and_only_reads_the_installed_package_s_copies(notebooks, tmp_path, monkeypatch):
    out = tmp_path / "out"
    refresh = plan_run(find_notebooks(notebooks), out, quick=True, refresh=True)
    assert refresh.refresh and refresh.record_times and refresh.ledger_dir == notebooks
    _as_an_installed_package(monkeypatch, notebooks)
    shipped = plan_run(find_notebooks(notebooks), out, quick=True)
    assert shipped.shipped and shipped.source.shipped and not shipped.refresh
    assert shipped.kernel_dir == out / "notebooks" and shipped.ledger_dir == out  # never beside the shipped copies
    for flag in ("refresh", "record_times"):
        with pytest.raises(ValueError, match="run it in a clone"):
            plan_run(find_notebooks(notebooks), out, quick=True, **{flag: True})
    assert not out.exists()


@pytest.fixture
def earlier(tmp_path):
    """``earlier(**changes)``: an output folder holding a quick-mode summary of this machine, as changed."""

    def write(*, records=True, rows=({"outcome": "faster"},), machine=None, **fields):
        folder = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        folder.mkdir()
        write_summary(folder, [NotebookRun("10_ok", True, 1.0), NotebookRun("20_fails", False, 2.0)], quick=True)
        doc = json.loads((folder / "summary.json").read_text())
        doc["measurements"] = [{"notebook": "10_ok", "trick": "noop", **row} for row in rows]
        doc["machine"].update(machine or {})
        doc.update(fields)
        (folder / "summary.json").write_text(json.dumps(doc))
        if records:
            (folder / "records.jsonl").write_text(json.dumps({"notebook": "10_ok"}) + "\n")
        return folder

    return write


def test_a_notebook_whose_run_was_killed_is_carried_over_as_not_finished(notebooks, earlier, monkeypatch):
    """A run of 10 killed while 10 ran (SIGKILL: no handler, no final summary) must not leave the earlier run's
    "ok" for 10 beside its own partial records: the next --only run carries 10 over as not finished."""
    import tricks_lib.report.runner as runner

    out = earlier()  # 10_ok ok, 20_fails failed

    def killed(plan, path, ctrl_c):
        with plan.records.open("a") as f:  # one of the notebook's records got written, then the process died
            f.write(json.dumps({"notebook": path.stem, "trick": "first of two"}) + "\n")
        raise SystemExit("killed")

    monkeypatch.setattr(runner, "_run_one", killed)
    with pytest.raises(SystemExit):
        runner.run_plan(plan_run(find_notebooks(notebooks, ["10"]), out, quick=True, progress=False))
    monkeypatch.undo()
    on_disk = {s["notebook"]: s for s in json.loads((out / "summary.json").read_text())["notebooks"]}
    assert not on_disk["10_ok"]["ok"] and on_disk["10_ok"]["error"].startswith("did not finish")
    nxt = plan_run(find_notebooks(notebooks, ["15"]), out, quick=True, progress=False)
    carried, _ = runner._carry_over(nxt)
    ten = next(r for r in carried if r.name == "10_ok")
    assert not ten.ok and ten.error.startswith("did not finish") and ten.carried_over


def test_an_earlier_summary_missing_keys_is_carried_over_without_a_traceback(notebooks, earlier):
    import tricks_lib.report.runner as runner

    out = earlier()
    doc = json.loads((out / "summary.json").read_text())
    for status in doc["notebooks"]:
        for key in ("seconds", "error", "failed_cell", "finished_at"):
            status.pop(key)
    doc["notebooks"][1].pop("ok")
    doc["notebooks"].append("not a status")
    (out / "summary.json").write_text(json.dumps(doc))
    carried, _ = runner._carry_over(plan_run(find_notebooks(notebooks, ["15"]), out, quick=True, progress=False))
    assert [(r.name, r.ok, r.error) for r in carried] == [
        ("10_ok", True, None),
        ("20_fails", False, "no status in the earlier summary"),
    ]


def test_a_subset_run_merges_only_into_a_summary_of_the_same_mode_machine_and_format(notebooks, earlier):
    paths = find_notebooks(notebooks, ["15"])

    def plan(out, quick=True):
        return plan_run(paths, out, quick=quick)

    same = plan(earlier())
    assert same.merge and same.earlier.compatible and same.replace_reason is None
    assert [s["notebook"] for s in same.earlier.statuses] == ["10_ok", "20_fails"]
    # Nothing to merge: no records to keep (nothing said), or no readable summary at all (nothing to replace).
    no_records = plan(earlier(records=False))
    assert not no_records.merge and no_records.earlier.compatible and no_records.replace_reason is None
    unreadable = earlier()
    (unreadable / "summary.json").write_text("{not json")
    assert plan(unreadable).earlier is None and not plan(unreadable).merge
    # Another mode, another machine, an older row format: this run's summary replaces it, saying why.
    assert plan(earlier(), quick=False).replace_reason == "was a quick-mode run, this one is full mode"
    assert not plan(earlier(), quick=False).merge
    other = plan(earlier(machine={"device_name": "Elsewhere GPU", "cpu_model": "Elsewhere CPU"}, machine_summary="M"))
    assert other.replace_reason == "ran on another machine (M)" and not other.merge
    here = describe()
    python = plan(earlier(machine={"python": "2.7.18"}))  # the one-line summaries agree: the field is named
    assert python.replace_reason == (
        f"ran on another machine ({dataclasses.replace(here, quick_mode=True).summary()}; "
        f"python 2.7.18 then, {here.python} now)"
    )
    older = plan(earlier(rows=({}, {"outcome": None})))
    assert older.replace_reason == "was written by an older tricks_lib (its rows carry no outcome)"
    assert not older.merge
    # Values, not display strings: a tuple stored as a list, a field an older EnvInfo lacked, the mode
    # recorded inside the machine: none of these is another machine.
    stored = earlier(machine={"quick_mode": False})
    doc = json.loads((stored / "summary.json").read_text())
    del doc["machine"]["fp16_tensor_cores"]
    assert isinstance(doc["machine"]["cpu_flags"], list)
    (stored / "summary.json").write_text(json.dumps(doc))
    assert plan(stored).merge


def test_summary_shows_compile_costs(tmp_path, monkeypatch):
    from tricks_lib.compiling import CompileCost
    from tricks_lib.report.results import record

    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    cost = CompileCost(9.0, 2.0, 1.5, 12.0, 5.0, compiled=lambda: None, namespace={"DEVICE": "cpu"})
    record("compile", cost, notebook="02")
    md, js = write_summary(tmp_path, [NotebookRun("02", True, 1.0)], quick=True)
    variants = {m["variant"]: m["median_s"] for m in json.loads(js.read_text())["measurements"]}
    assert variants == {"first call, empty caches": 9.0, "first call, warm on-disk cache": 2.0, "import torch": 1.5}
    assert "first call, empty caches | 9 s" in md.read_text()


# --- the shared run: read what it wrote ----------------------------------------------------------


@pytest.mark.slow
def test_run_records_summary_and_refresh(shared_run):
    first, out = shared_run.first, shared_run.out
    assert {s["notebook"]: s["ok"] for s in first.summary["notebooks"]} == {"10_ok": True, "20_fails": False}
    refreshed = nbformat.read(shared_run.notebooks / "10_ok.ipynb", as_version=4)
    last = refreshed.cells[-1]
    assert last.execution_count == 2
    assert last.outputs[0]["data"]["text/plain"] == "True"  # the kernel saw quick mode
    summary = json.loads((out / "summary.json").read_text())
    assert first.summary["mode"] == summary["mode"] == "quick"
    assert [m["trick"] for m in first.summary["measurements"]] == ["noop"]
    assert summary["measurements"][0]["notebook"] == "10_ok"
    md = (out / "summary.md").read_text()
    assert "## 10_ok" in md and "| noop |" in md
    assert (out / "notebooks" / "10_ok.ipynb").exists()


@pytest.mark.slow
def test_kernels_get_their_environment_passed_to_them(shared_run):
    # cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, at the first cuBLAS call: setting it inside a cell
    # is too late once any matmul ran, so the kernel must start with it. None of these variables was
    # set in this process while the run lasted (the shared run cleared them): the runner passed them.
    executed = nbformat.read(shared_run.out / "notebooks" / "15_env.ipynb", as_version=4)
    seen = ast.literal_eval(executed.cells[-1].outputs[0]["data"]["text/plain"])
    assert seen == {
        "TRICKS_QUICK": "1",
        "TRICKS_RESULTS": str((shared_run.out / "records.jsonl").resolve()),
        "TRICKS_NOTEBOOK": "15_env",
        "TRICKS_PROGRESS": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }


@pytest.mark.slow
def test_running_leaves_this_process_s_environment_alone(shared_run):
    assert shared_run.environ_after == shared_run.environ_before
    assert not set(KERNEL_VARS) & set(shared_run.environ_after)  # as the shared run left them: unset
    assert shared_run.environ_writes == ()  # not even set and restored while the kernels ran


@pytest.mark.slow
def test_failure_names_notebook_and_cell(shared_run):
    first = shared_run.first
    assert first.code == 1
    assert "FAILED: 20_fails.ipynb, cell 3 of 4 (code cell 2: `raise RuntimeError('boom')`)" in first.err
    assert "RuntimeError: boom" in first.err and "\x1b[" not in first.err
    failed = next(s for s in first.summary["notebooks"] if s["notebook"] == "20_fails")
    assert failed["failed_cell"].startswith("cell 3 of 4")
    # a failed notebook is never written back in place (the run had --refresh; 10_ok was written back)
    assert all(
        c.get("outputs", []) == []
        for c in nbformat.read(shared_run.notebooks / "20_fails.ipynb", 4).cells
        if c.cell_type == "code"
    )


@pytest.mark.slow
def test_unreadable_notebook_is_reported_not_fatal(shared_run):
    ran = [s for s in shared_run.second.summary["notebooks"] if not s["carried_over"]]
    assert [(s["notebook"], s["ok"]) for s in ran] == [("12_broken", False), ("15_env", True)]
    assert ran[0]["error"].startswith("cannot be read")
    assert "FAILED: 12_broken.ipynb, before any cell ran: cannot be read" in shared_run.second.err


@pytest.mark.slow
def test_a_subset_run_merges_into_the_earlier_run_and_says_so(shared_run):
    first, second, out = shared_run.first, shared_run.second, shared_run.out
    # Running only 12 and 15 keeps 10's and 20's rows and statuses (stamped as kept), instead of dropping them.
    assert f"Summary merged: 10_ok, 20_fails kept from the earlier run in {out}/" in second.err
    assert "Summary replaced" not in second.err
    # A kept failure is still a failure: named, and the exit code says so.
    assert second.code == 1 and "FAILED: 20_fails.ipynb, cell 3 of 4" in second.err
    merged = json.loads((out / "summary.json").read_text())
    assert merged == second.summary
    assert [m["trick"] for m in merged["measurements"]] == ["noop"]
    by_name = {s["notebook"]: s for s in merged["notebooks"]}
    assert list(by_name) == ["10_ok", "12_broken", "15_env", "20_fails"]
    assert by_name["10_ok"]["carried_over"] is True and by_name["15_env"]["carried_over"] is False
    assert by_name["20_fails"]["carried_over"] is True and by_name["12_broken"]["carried_over"] is False
    first_10 = next(s for s in first.summary["notebooks"] if s["notebook"] == "10_ok")
    assert by_name["10_ok"]["finished_at"] == first_10["finished_at"]
    assert "(earlier run, kept)" in (out / "summary.md").read_text()
    # summary.html follows the merged summary.json: a section per notebook it lists, the kept ones marked.
    page = parse_page((out / "summary.html").read_text())
    assert page.sections == [f"nb-{s['notebook']}" for s in merged["notebooks"]]
    assert page.sections == ["nb-10_ok", "nb-12_broken", "nb-15_env", "nb-20_fails"]
    assert "(earlier run, kept)" in " ".join(page.text) and "noop" in " ".join(page.text)


@pytest.mark.slow
def test_run_times_are_recorded_beside_the_notebooks_only_on_refresh_and_read_by_the_dry_run(shared_run, capsys):
    beside = json.loads((shared_run.notebooks / "run_times.json").read_text())
    assert sorted(beside) == ["10_ok"]  # the --refresh run's clean notebooks only (20 failed)
    assert len(beside["10_ok"]["quick"]["cells"]) == 2 and "full" not in beside["10_ok"]
    assert sorted(json.loads((shared_run.out / "run_times.json").read_text())) == ["15_env"]  # the plain run's
    notebooks, out = str(shared_run.notebooks), str(shared_run.out)
    argv = ["run", "--dry-run", "--quick", "--notebooks", notebooks, "--out", out, "--only"]
    assert main([*argv, "10", "15", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[:4] == ["10_ok", "last", "quick", "run"] and lines[3].split()[:4] == [
        "15_env",
        "last",
        "quick",
        "run",
    ]
    assert lines[4].endswith("no quick run recorded") and lines[5].startswith("Expected: ")
    assert lines[5].endswith(", plus 1 notebook(s) with no quick run recorded")


# --- runs of their own ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_mode_subset_run_replaces_a_quick_mode_summary_and_says_so(shared_run, tmp_path, capsys, monkeypatch):
    notebooks, out = shared_run.copy_to(tmp_path)
    monkeypatch.setenv("TRICKS_QUICK", "0")
    assert main(["run", "--notebooks", str(notebooks), "--out", str(out), "--no-progress", "--only", "15"]) == 0
    err = capsys.readouterr().err
    assert f"Summary replaced: the earlier run in {out}/ was a quick-mode run, this one is full mode\n" in err
    assert "Summary merged" not in err
    replaced = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in replaced["notebooks"]] == ["15_env"] and replaced["measurements"] == []
    assert replaced["mode"] == "full"
    page = parse_page((out / "summary.html").read_text())
    assert page.sections == ["nb-15_env"] and "noop" not in " ".join(page.text)


@pytest.mark.slow
def test_cell_timeout_is_enforced(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    write_nb(folder / "30_slow.ipynb", "import time\ntime.sleep(60)")
    runs = run_notebooks(find_notebooks(folder), tmp_path / "out", quick=True, timeout=2, progress=False)
    assert not runs[0].ok and "Timeout" in runs[0].error
    assert runs[0].seconds < 45


def test_what_a_stopped_kernel_leaves_in_the_temp_folder_is_removed_with_it(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    # A temporary folder the kernel never removes (a killed kernel's TemporaryDirectory, a child's files).
    write_nb(
        folder / "40_leaks.ipynb",
        "import os, tempfile\nleft = tempfile.mkdtemp()\nopen(os.path.join(left, 'x'), 'wb').write(b'1' * 1000)",
        "import json, os\nprint(json.dumps([left, os.environ['TORCHINDUCTOR_CACHE_DIR']]))",
    )
    runs = run_notebooks(find_notebooks(folder), tmp_path / "out", quick=True, progress=False)
    assert runs[0].ok, runs[0].error
    executed = nbformat.read(tmp_path / "out" / "notebooks" / "40_leaks.ipynb", as_version=4)
    left, inductor_cache = json.loads(executed.cells[2].outputs[0]["text"])
    assert not os.path.exists(left) and not os.path.exists(os.path.dirname(left))
    assert not inductor_cache.startswith(os.path.dirname(left))  # the compile cache is meant to last: kept


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


# --- the command line, without kernels -----------------------------------------------------------


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
    assert "error: --timeout must be a positive number of seconds" in capsys.readouterr().err
    assert main(["run", "--notebooks", str(tmp_path)]) == 2
    assert "no notebooks" in capsys.readouterr().err


def test_out_pointing_at_a_file_is_a_clear_error(notebooks, tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("not a folder")
    assert main(["run", "--quick", "--notebooks", str(notebooks), "--out", str(target), "--no-progress"]) == 2
    assert "is a file" in capsys.readouterr().err and target.read_text() == "not a folder"


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
    from tricks_lib.report.notebook_source import STANDARD_KERNELSPEC

    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
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
    assert locate_notebooks(notebooks) == NotebookSource(notebooks, "--notebooks")
    here = locate_notebooks()
    assert (here.origin, here.folder) == ("checkout", Path(__file__).resolve().parents[2] / "notebooks")
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
    argv = ["run", "--dry-run", "--quick", "--notebooks", str(notebooks), "--out", str(out), "--only", "10", "15"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Notebooks: {notebooks} (--notebooks)"
    assert lines[1] == f"Would run 2 notebook(s) in quick mode -> {out}/"
    assert [line.split()[0] for line in lines[2:4]] == ["10_ok", "15_env"]
    assert all(line.endswith("no quick run recorded") for line in lines[2:4]) and not out.exists()
    assert lines[4] == "Expected: unknown (no run recorded)"


def test_the_installed_package_s_notebooks_are_never_refreshed(notebooks, tmp_path, monkeypatch, capsys):
    _as_an_installed_package(monkeypatch, notebooks)
    for flag in ("--refresh", "--record-times"):
        assert main(["run", flag, "--quick", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
        assert "installed package's copy" in capsys.readouterr().err
    with pytest.raises(ValueError, match="run it in a clone"):
        run_notebooks(find_notebooks(notebooks, ["10"]), tmp_path / "o", quick=True, refresh=True, progress=False)
    # Named with --notebooks, they are still the installed copies: one line, no traceback, nothing run.
    argv = ["run", "--refresh", "--quick", "--notebooks", str(notebooks), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --refresh and --record-times write into") and "run it in a clone" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_full_disk_fails_the_notebook_and_still_writes_the_summary(notebooks, tmp_path, monkeypatch, capsys):
    import errno

    import tricks_lib.report.runner as runner

    def full_disk(nb, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runner, "_write_notebook", full_disk)
    out = tmp_path / "out"
    argv = ["run", "--quick", "--notebooks", str(notebooks), "--out", str(out), "--no-progress", "--only", "10"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "FAILED: 10_ok.ipynb" in err and "No space left on device" in err and "Traceback" not in err
    (status,) = json.loads((out / "summary.json").read_text())["notebooks"]
    assert not status["ok"] and status["error"].startswith("could not write ") and "10_ok.ipynb" in status["error"]
    # When the summary itself cannot be written, the terminal gets each notebook's outcome and one error line.
    monkeypatch.setattr(runner, "write_summary_files", lambda *a, **k: full_disk(None, out / "summary.json"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "FAILED: 10_ok: could not write" in err and "could not write the summary" in err and "Traceback" not in err
