"""summary.json and summary.md: every result type records its own rows; the schema is pinned."""

import json

import pytest

from tricks_lib.batch_size import BatchProbe, BatchSearch
from tricks_lib.compiling import CompileCost
from tricks_lib.ddp import DDPResult
from tricks_lib.env import describe
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.results import load_records, record
from tricks_lib.summary import SUMMARY_ROW_KEYS, NotebookStatus, write_summary_files

# The schema readers' scripts rely on: change it on purpose, here and in the README, or not at all.
PINNED_KEYS = (
    "notebook",
    "trick",
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
    ddp = DDPResult(
        world_size=2,
        backend="gloo",
        device="cpu",
        batch_size=16,
        accumulation_steps=4,
        steps=3,
        step_times=(0.1, 0.12, 0.11),
        samples_per_second=290.9,
        final_loss=1.0,
        num_parameters=10,
        params_identical=True,
        max_param_difference=0.0,
        threads_per_process=1,
        allreduce_calls=3,
        buckets=1,
        backward_passes=12,
        no_sync=False,
    )
    return {
        "measurement": m,
        "comparison": comparison,
        "memory": mem,
        "compile": compile_cost,
        "batch search": batch,
        "ddp": ddp,
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
    assert set(summary) == {"machine", "machine_summary", "mode", "notebooks", "measurements", "verdicts"}
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
    fast = by_trick["comparison"][1]
    assert fast["verdict"] == "2.00x faster" and fast["saved_bytes"] == 4096 and fast["peak_saved_bytes"] == 2048
    assert [r["median_s"] for r in by_trick["compile"]] == [9.0, 0.7, 1.0]
    assert by_trick["batch search"][0]["verdict"].startswith("batch 64 within 1.00 MiB")
    assert by_trick["batch search"][0]["saved_bytes"] == 1000
    ddp = by_trick["ddp"][0]
    assert ddp["variant"] == "2 x gloo processes, 4 micro-batches, no_sync off"
    assert ddp["median_s"] == pytest.approx(0.11) and ddp["items_per_second"] == 290.9
    assert by_trick["measurement"][0]["items_per_second"] == pytest.approx(8 / 1e-3)
    md = md_path.read_text()
    table = [line for line in md.splitlines() if line.startswith("| 99_test | ")]
    assert len(table) == len(rows) + 1  # one status line, one line per row
    assert "| 99_test | comparison | fast | 500 us |" in md
    # No temporary files left next to the final names.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl", "summary.json", "summary.md"]
