"""summary.json and summary.md: every result type records its own rows; the schema is pinned."""

import json

import pytest

from tricks_lib.compiling import CompileCost
from tricks_lib.env import describe
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.report.results import load_records, record
from tricks_lib.report.summary import SUMMARY_ROW_KEYS, NotebookStatus, write_summary_files
from tricks_lib.training.batch_size import BatchProbe, BatchSearch

# The schema readers' scripts rely on: change it on purpose, here and in the README, or not at all.
PINNED_KEYS = (
    "notebook",
    "trick",
    "kind",
    "record",
    "variant",
    "device",
    "median_s",
    "iqr_s",
    "speedup",
    "verdict",
    "items_per_second",
    "saved_bytes",
    "peak_saved_bytes",
    "peak_allocated_bytes",
    "noisy",
    "speedup_low",
    "speedup_high",
    "significant",
    "outcome",
    "min_effect",
)


def one_of_each():
    m = Measurement("step", (1e-3, 1.1e-3, 0.9e-3), 1, "cpu", 2, items=8)
    fast = Measurement("fast", (0.5e-3, 0.5e-3, 0.5e-3), 1, "cpu", 2, items=8)
    mem = MemoryReport("forward", "cpu", saved_bytes=4096, saved_tensors=2, peak_saved_bytes=2048)
    comparison = Comparison(
        label="c",
        baseline="step",
        rows=(
            ComparisonRow("step", m, 1.0, 1.0, 1.0, False, True),
            ComparisonRow("fast", fast, 2.0, 1.9, 2.1, True, False, memory=mem),
        ),
        rounds=3,
        device="cpu",
        num_threads=2,
        min_effect=0.03,
    )
    compile_cost = CompileCost(9.0, 0.7, 1.0, 12.0, 3.0, compiled=lambda: None, namespace={"DEVICE": "cpu"})
    batch = BatchSearch(64, 1 << 20, "cpu", "saved for backward", 1, 256, (BatchProbe(64, True, 1000),))
    return {
        "measurement": m,
        "comparison": comparison,
        "memory": mem,
        "compile": compile_cost,
        "batch search": batch,
    }


def test_summary_row_schema_is_pinned():
    assert SUMMARY_ROW_KEYS == PINNED_KEYS


def test_every_result_type_reaches_both_summary_files(monkeypatch, tmp_path):
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "99_test")
    results = one_of_each()
    for kind, result in results.items():
        assert record(kind, result).kind == kind
    env = describe()
    statuses = [NotebookStatus("99_test", True, 1.5, None, None)]
    md_path, json_path = write_summary_files(tmp_path, env, statuses, load_records(tmp_path / "records.jsonl"))
    summary = json.loads(json_path.read_text())
    assert set(summary) == {"machine", "machine_summary", "mode", "notebooks", "measurements", "verdicts", "problems"}
    assert summary["problems"] == []
    assert summary["notebooks"] == [
        {
            "notebook": "99_test",
            "ok": True,
            "seconds": 1.5,
            "failed_cell": None,
            "error": None,
            "finished_at": "-",
            "carried_over": False,
        }
    ]
    rows = summary["measurements"]
    assert all(tuple(r) == PINNED_KEYS for r in rows)
    by_trick = {}
    for r in rows:
        by_trick.setdefault(r["trick"], []).append(r)
    assert [r["variant"] for r in by_trick["comparison"]] == ["step", "fast"]
    step, fast = by_trick["comparison"]
    assert fast["verdict"] == "2.00x faster" and fast["saved_bytes"] == 4096 and fast["peak_saved_bytes"] == 2048
    # The paired interval and significance reach the row (the HTML page plots them); not for the baseline.
    assert (fast["speedup_low"], fast["speedup_high"], fast["significant"]) == (1.9, 2.1, True)
    assert (step["speedup_low"], step["speedup_high"], step["significant"]) == (None, None, None)
    assert (step["outcome"], fast["outcome"]) == ("baseline", "faster")
    assert {r["record"] for r in by_trick["comparison"]} == {1}  # one record's rows share its number
    assert all(r["outcome"] is None for r in rows if r["kind"] != "comparison")
    assert {r["kind"] for r in rows} == set(results) and all(r["kind"] == r["trick"] for r in rows)
    assert [r["median_s"] for r in by_trick["compile"]] == [9.0, 0.7, 1.0]
    assert by_trick["batch search"][0]["verdict"].startswith("batch 64 within 1.00 MiB")
    assert by_trick["batch search"][0]["saved_bytes"] == 1000
    assert by_trick["measurement"][0]["items_per_second"] == pytest.approx(8 / 1e-3)
    md = md_path.read_text()
    # Grouped by notebook: the status line, then the notebook's section with one line per measured row.
    assert [line for line in md.splitlines() if line.startswith("| 99_test | ")] == ["| 99_test | ok | 1.5 s | - |"]
    section = md.split("\n## 99_test\n", 1)[1]
    assert len([line for line in section.splitlines() if line.startswith("| ") and "---" not in line]) == len(rows) + 1
    assert "| comparison | fast | 500 us |" in section
    assert "| 2.00x [1.90, 2.10] | 2.00x faster |" in section
    # No temporary files left next to the final names.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl", "summary.html", "summary.json", "summary.md"]


def test_a_noisy_time_is_flagged_in_both_summary_files(tmp_path, monkeypatch):
    # One quick run once reported "7.26x slower" with a spread larger than its median, unflagged.
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "98_noise")
    quiet = Measurement("quiet", (1.0e-3,) * 5 + (1.01e-3,) * 5, 1, "cpu", 2)
    noisy = Measurement("noisy", (1e-3, 5e-3, 9e-3, 2e-3, 7e-3, 1e-3, 8e-3, 3e-3, 6e-3, 4e-3), 1, "cpu", 2)
    record("quiet", quiet)
    record("noisy", noisy)
    statuses = [NotebookStatus("98_noise", True, 1.0, None, None)]
    md_path, json_path = write_summary_files(tmp_path, describe(), statuses, load_records(tmp_path / "records.jsonl"))
    rows = {r["trick"]: r for r in json.loads(json_path.read_text())["measurements"]}
    assert rows["noisy"]["noisy"] is True and rows["quiet"]["noisy"] is False
    lines = {line.split(" | ")[0]: line for line in md_path.read_text().splitlines() if line.startswith("| ")}
    assert "(noisy)" in lines["| noisy"] and "(noisy)" not in lines["| quiet"]


def test_a_comparison_fills_its_rows_interval_significance_and_outcome_itself():
    # The summary copies each result's own rows: nothing downstream repairs them from the details.
    from tricks_lib.measurements import paired_row

    base = Measurement("base", (2e-3,) * 10, 1, "cpu", 1)
    slow = Measurement("slow", (4e-3,) * 10, 1, "cpu", 1)
    same = Measurement("same", (2e-3,) * 10, 1, "cpu", 1)
    rows = {m.label: paired_row(m, base, min_effect=0.05).summary_row() for m in (base, slow, same)}
    assert (rows["slow"].speedup_low, rows["slow"].speedup_high, rows["slow"].significant) == (0.5, 0.5, True)
    assert [rows[n].outcome for n in ("base", "slow", "same")] == ["baseline", "slower", "not significant"]
    assert rows["same"].significant is False and rows["base"].significant is None


def test_a_verdict_row_with_cells_before_its_verdict_keeps_them_in_the_summary(tmp_path, monkeypatch):
    # A table with cells before its verdict (01 had trick, vs, warm, cold, not faster here, limits): the "measured"
    # cell alone can be "-"
    # for a trick faster everywhere, which the summary printed as the whole verdict.
    from tricks_lib.report.summary import summary_rows
    from tricks_lib.report.verdicts import VerdictTable

    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "96_cells")
    table = VerdictTable(("trick", "vs", "warm", "cold", "not faster here", "limits"))
    table.add("tar shards", "-", "new shards", before=("folder", "4.91x faster", "5.27x faster"))
    table.add("no cells", "1.10x faster", "-", before=("folder", "n/a", "n/a"))
    (row, _) = summary_rows(load_records(tmp_path / "records.jsonl"), verdicts=True)
    assert row["verdict"] == "vs: folder; warm: 4.91x faster; cold: 5.27x faster; not faster here: -"
    plain = VerdictTable(record_rows=False)
    assert plain.add("x", "1.1x faster", "-").columns == ("measured here",)


def test_a_torn_record_line_is_skipped_named_and_fails_the_run(monkeypatch, tmp_path, capsys):
    """A kill can tear the last line of records.jsonl: the summary of everything else is still written, the line
    is named in it, and the main command fails naming it (never a traceback and no summary)."""
    from tricks_lib.report.runner import NotebookRun, write_summary

    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "99_test")
    record("kept", one_of_each()["comparison"])
    with (tmp_path / "records.jsonl").open("a") as f:
        f.write('{"notebook": "99_test", "trick": "torn", "ki')
    with pytest.raises(ValueError, match="line 2"):
        load_records(tmp_path / "records.jsonl")
    _, json_path = write_summary(tmp_path, [NotebookRun("99_test", True, 1.0)], quick=True)
    summary = json.loads(json_path.read_text())
    assert [r["trick"] for r in summary["measurements"]][:1] == ["kept"]
    assert len(summary["problems"]) == 1 and "records.jsonl line 2" in summary["problems"][0]
    assert "skipped" in summary["problems"][0]
