"""tricks_lib.report.results: records, the JSON-lines file the main command reads, and errors."""

import json

import pytest
import torch

from tricks_lib.comparing import Budget, compare
from tricks_lib.memory import measure_memory
from tricks_lib.report.results import Record, load_records, record
from tricks_lib.timing import measure


def test_record_without_main_command_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("TRICKS_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    rec = record("noop", measure(lambda: None, min_run_time=0.01, device="cpu"))
    assert isinstance(rec, Record) and rec.kind == "measurement" and rec.notebook == "interactive"
    assert list(tmp_path.iterdir()) == []


def test_records_round_trip_through_the_results_file(monkeypatch, tmp_path):
    target = tmp_path / "records.jsonl"
    monkeypatch.setenv("TRICKS_RESULTS", str(target))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "99_test")
    c = compare(
        {"a": lambda: None, "b": lambda: None},
        baseline="a",
        budget=Budget(min_rounds=10, min_run_time=0.01),
        device="cpu",
    )
    record("two no-ops", c)
    lin = torch.nn.Linear(4, 4)
    record("memory", measure_memory(lambda: lin(torch.randn(2, 4)), device="cpu"))
    lines = target.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["trick"] == "two no-ops"
    recs = load_records(target)
    assert [r.trick for r in recs] == ["two no-ops", "memory"]
    assert recs[0].notebook == "99_test" and recs[0].kind == "comparison"
    assert [row["variant"] for row in recs[0].rows] == ["a", "b"]
    assert recs[1].rows[0]["saved_bytes"] == 2 * 4 * 4


def test_bad_inputs(tmp_path):
    with pytest.raises(
        TypeError, match="Comparison, Measurement, MemoryReport, CompileCost, BatchSearch or VerdictRow"
    ):
        record("x", 1.5)
    with pytest.raises(ValueError, match="name the trick"):
        record("  ", measure(lambda: None, min_run_time=0.01, device="cpu"))
    with pytest.raises(TypeError, match="string"):
        record(3, measure(lambda: None, min_run_time=0.01, device="cpu"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trick": "x"}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_records(bad)
    assert load_records(tmp_path / "missing.jsonl") == []


def test_compile_costs_are_recorded(monkeypatch, tmp_path):
    from tricks_lib.compiling import CompileCost

    target = tmp_path / "records.jsonl"
    monkeypatch.setenv("TRICKS_RESULTS", str(target))
    cost = CompileCost(
        cold_seconds=9.0,
        warm_seconds=2.0,
        import_torch_seconds=1.5,
        cold_process_seconds=12.0,
        warm_process_seconds=5.0,
        compiled=lambda: None,
        namespace={"DEVICE": torch.device("cpu")},
    )
    rec = record("torch.compile", cost)
    assert rec.kind == "compile" and rec.device == "cpu"
    row = load_records(target)[0].rows[0]
    assert row["cold_first_call_s"] == 9.0 and row["warm_first_call_s"] == 2.0 and row["import_torch_s"] == 1.5
