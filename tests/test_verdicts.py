"""tricks_lib.report.verdicts: the verdict table and the reading helpers, on results with known numbers."""

import dataclasses
import json

import pytest
import torch

from tricks_lib.compiling import CompileCost
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.report.results import load_records
from tricks_lib.report.verdicts import (
    VerdictTable,
    break_even,
    break_even_note,
    by_outcome,
    direction,
    fastest,
    median_drift,
    memory_change,
    overall,
    paired_ratio,
    separate_runs_ratio,
    trade_off,
    verdict_of,
)
from tricks_lib.training.steps import autocast_dtype


def timed(label, seconds, rounds=20, items=None, jitter=0.002):
    # Alternating +-jitter per round: a spread, and paired ratios that are the same every round.
    times = tuple(seconds * (1 + (jitter if i % 2 else -jitter)) for i in range(rounds))
    return Measurement(label, times, 1, "cpu", 2, items=items)


def comparison(costs, baseline, items=None):
    """A Comparison read from known per-call times, through the same Comparison.versus the harness uses."""
    measurements = {name: timed(name, s, items=(items or {}).get(name)) for name, s in costs.items()}
    rows = tuple(ComparisonRow(n, m, 1.0, 1.0, 1.0, False, n == baseline) for n, m in measurements.items())
    c = Comparison("c", baseline, rows, rounds=20, device="cpu", num_threads=2, min_effect=0.03, per_item=bool(items))
    return Comparison(
        "c", baseline, tuple(c.versus(n, baseline) for n in costs), 20, "cpu", 2, 0.03, per_item=bool(items)
    )


def test_reading_helpers_on_known_times():
    c = comparison({"eager": 4e-3, "compiled": 1e-3, "same": 4e-3}, "eager")
    assert verdict_of(c, "compiled") == "4.00x faster"
    assert verdict_of(c, "eager", against="compiled") == "4.00x slower"
    assert verdict_of(c, "same") == "not significant"
    assert paired_ratio(c, "compiled", "same") == pytest.approx(4.0)
    assert fastest(c) == ("compiled", True)
    tie = comparison({"a": 1e-3, "b": 1.01e-3}, "a")
    assert fastest(tie) == ("a", False)  # 1% is within the 3% threshold: no clear winner
    # Throughput: 8 items in 2 ms beats 1 item in 1 ms.
    per_item = comparison({"small": 1e-3, "big": 2e-3}, "small", items={"small": 1, "big": 8})
    assert fastest(per_item) == ("big", True) and verdict_of(per_item, "big") == "4.00x faster"


def test_break_even_only_when_the_compiled_call_is_faster():
    cost = CompileCost(10.0005, 1.0005, 1.0, 12.0, 3.0, compiled=lambda: None, namespace={})
    c = comparison({"eager": 4e-3, "compiled": 1e-3}, "eager")
    # (first - compiled) / (eager - compiled), rounded up: 9.9995 / 0.003 = 3333.2, 0.9995 / 0.003 = 333.2.
    assert break_even(cost, c, "compiled", "eager") == {"cold": 3334, "warm": 334}
    slower = comparison({"eager": 1e-3, "compiled": 4e-3}, "eager")
    assert break_even(cost, slower, "compiled", "eager") is None
    same = comparison({"eager": 1e-3, "compiled": 1e-3}, "eager")
    assert break_even(cost, same, "compiled", "eager") is None


def test_break_even_note_reads_break_even_in_words():
    assert break_even_note({"cold": 3334, "warm": 334}) == "pays off after 3,334 calls cold, 334 warm"
    assert break_even_note({"cold": 594, "warm": 45}, unit="steps") == "pays off after 594 steps cold, 45 warm"
    assert break_even_note(None) == "never pays off here"
    with pytest.raises(ValueError, match="'warm'"):
        break_even_note({"cold": 3})
    with pytest.raises(TypeError, match="whole number"):
        break_even_note({"cold": 3.5, "warm": 1})
    with pytest.raises(TypeError, match="whole number"):
        break_even_note({"cold": True, "warm": 1})
    with pytest.raises(ValueError, match="positive"):
        break_even_note({"cold": 0, "warm": 1})
    with pytest.raises(TypeError, match="dict or None"):
        break_even_note(3334)
    with pytest.raises(ValueError, match="what is counted"):
        break_even_note(None, unit=" ")
    with pytest.raises(TypeError, match="unit"):
        break_even_note(None, unit=None)


def test_separate_runs_ratio_says_it_was_not_tested():
    one = Measurement("one process", (2e-3, 2e-3, 2e-3), 1, "cpu", 2, items=64)
    two = Measurement("two ranks", (2.5e-3, 2.5e-3, 2.5e-3), 1, "cpu", 1, items=128)
    # 128 items in 2.5 ms against 64 in 2 ms: 1.6x the throughput.
    assert separate_runs_ratio(two, one) == "1.60x the items/s of one process (separate runs, not tested)"
    plain = Measurement("plain", (4e-3,), 1, "cpu", 2)
    assert separate_runs_ratio(two, plain) == "1.60x the calls/s of plain (separate runs, not tested)"
    with pytest.raises(TypeError, match="Measurement"):
        separate_runs_ratio(two, 1.0)
    with pytest.raises(ValueError, match="median of zero"):
        separate_runs_ratio(two, Measurement("zero", (0.0,), 1, "cpu", 2))


def test_memory_change_in_words():
    def report(saved, peak=None):
        return MemoryReport("x", "cpu", saved_bytes=saved, saved_tensors=1, peak_saved_bytes=peak or saved)

    assert memory_change(report(4096), report(1024)) == "4.00x less"
    assert memory_change(report(1024), report(1536)) == "1.50x more"
    assert memory_change(report(1024), report(1024)) == "same"
    assert memory_change(report(4096), report(0)) == "none kept (was 4.00 KiB)"
    assert memory_change(report(4096, 4096), report(4096, 1024)) == "4.00x less"  # the peak, by default
    assert memory_change(report(4096, 4096), report(4096, 1024), field="saved_bytes") == "same"
    with pytest.raises(ValueError, match="CUDA only"):
        memory_change(report(1), report(1), field="peak_allocated_bytes")
    with pytest.raises(ValueError, match="byte count"):
        memory_change(report(1), report(1), field="label")


def test_verdict_table_rows_render_and_reach_the_summary(monkeypatch, tmp_path):
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "99_test")
    c = comparison({"eager": 4e-3, "compiled": 1e-3}, "eager")
    table = VerdictTable()
    table.add("torch.compile", c, "short jobs", variant="compiled")
    table.add("eager against compiled", c, "-", variant="eager", against="compiled")
    table.add("the row itself", c["compiled"], "-", note="; 2 MiB saved")
    table.add("a computed fact", f"two runs identical: {'yes' if 1 + 1 == 2 else 'no'}", "same hardware only")
    md = table.to_markdown()
    assert md.splitlines()[0] == "| trick | measured here | when it does not help |"
    assert "| torch.compile | 4.00x faster | short jobs |" in md
    assert "| eager against compiled | 4.00x slower | - |" in md
    assert "| the row itself | 4.00x faster; 2 MiB saved | - |" in md
    assert table._repr_markdown_() == md and "<td>a computed fact</td>" in table.to_html()
    records = load_records(tmp_path / "records.jsonl")
    assert [r.kind for r in records] == ["verdict"] * 4
    assert records[0].summary[0]["verdict"] == "4.00x faster" and records[0].summary[0]["speedup"] == pytest.approx(4)
    json.dumps([r.to_dict() for r in records], allow_nan=False)


def test_verdict_table_bad_input():
    table = VerdictTable(record_rows=False)
    c = comparison({"a": 1e-3, "b": 2e-3}, "a")
    with pytest.raises(TypeError, match="needs variant="):
        table.add("x", c, "-")
    with pytest.raises(KeyError):
        table.add("x", c, "-", variant="zz")
    with pytest.raises(TypeError, match="computed sentence"):
        table.add("x", 1.5, "-")
    with pytest.raises(TypeError, match="caveat"):
        table.add("x", "fact", None)
    with pytest.raises(TypeError, match="3 column titles"):
        VerdictTable(("a", "b"))
    with pytest.raises(ValueError, match="column"):
        table.add("x", "fact", "-", before=("extra",))
    assert table.rows == []


def test_verdict_table_reads_mappings_and_replicates():
    table = VerdictTable(record_rows=False)
    row = table.add("from_numpy", {"copy avoided": "16.0 MiB", "GB/s": 5.2}, "arrays modified afterwards")
    assert row.measured == "copy avoided: 16.0 MiB; GB/s: 5.2"
    c = comparison({"a": 2e-3, "b": 1e-3}, "a")
    replicated = dataclasses.replace(
        c, rows=(c["a"], dataclasses.replace(c["b"], replicate_speedups=(1.98, 2.0, 2.02)))
    )
    row = table.add("b, replicates", replicated, "-", variant="b", replicates=True, note="; more")
    assert row.measured == "2.00x faster (each replicate: 1.98x, 2.00x, 2.02x); more"
    with pytest.raises(ValueError, match="replicates=n"):
        table.add("b", c, "-", variant="b", replicates=True)
    with pytest.raises(ValueError, match="replicates=n"):
        table.add("fact", "a sentence", "-", replicates=True)
    with pytest.raises(TypeError, match="True or False"):
        table.add("b", replicated, "-", variant="b", replicates=1)
    with pytest.raises(ValueError, match="empty"):
        table.add("x", {}, "-")
    with pytest.raises(TypeError, match="label must be a string"):
        table.add("x", {1023: "slower"}, "-")
    assert [r.trick for r in table.rows] == ["from_numpy", "b, replicates"]


def test_extra_columns_before_the_verdict():
    table = VerdictTable(("trick", "saved for backward", "time", "when it does not help"), record_rows=False)
    c = comparison({"a": 2e-3, "b": 1e-3}, "a")
    table.add("b", c, "never", variant="b", before=("4.00x less",))
    assert "| b | 4.00x less | 2.00x faster | never |" in table.to_markdown()
    with pytest.raises(ValueError, match="1 column"):
        table.add("b", c, "never", variant="b")


def test_autocast_dtype_is_one_rule():
    assert autocast_dtype("cpu") == torch.bfloat16
    assert autocast_dtype(torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="device"):
        autocast_dtype("tpu")
    if torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability()
        assert autocast_dtype("cuda") == (torch.bfloat16 if major >= 8 else torch.float16)


def test_direction_overall_and_by_outcome():
    c = comparison({"base": 2e-3, "fast": 1e-3, "slow": 4e-3, "same": 2e-3}, "base")
    assert [direction(c[n]) for n in c.names] == ["baseline", "faster", "slower", "not significant"]
    assert overall([c["fast"]]) == "all faster" and overall([c["base"], c["slow"]]) == "all slower"
    assert overall([c["same"]]) == "none significant" and overall(c.rows) == "mixed"
    assert by_outcome({r.name: r for r in c.rows}) == {
        "faster": ("fast",),
        "slower": ("slow",),
        "not significant": ("same",),
    }
    with pytest.raises(ValueError, match="not the baseline"):
        overall([c["base"]])
    with pytest.raises(TypeError, match="ComparisonRow"):
        direction(c)


def with_memory(c, peaks, cuda=None):
    """The comparison ``c`` with a MemoryReport per row: peak saved bytes from ``peaks`` (and CUDA peaks from ``cuda``)."""
    rows = []
    for r in c.rows:
        extra = {} if cuda is None else {"peak_allocated_bytes": 100 + cuda[r.name], "allocated_before_bytes": 100}
        report = MemoryReport(
            r.name, "cpu", saved_bytes=2 * peaks[r.name], saved_tensors=1, peak_saved_bytes=peaks[r.name], **extra
        )
        rows.append(dataclasses.replace(r, memory=report))
    return dataclasses.replace(c, rows=tuple(rows))


def test_trade_off_reads_time_and_memory_of_each_variant():
    c = with_memory(
        comparison({"plain": 1e-3, "ckpt": 2e-3, "amp": 1e-3}, "plain"), {"plain": 4096, "ckpt": 1024, "amp": 4096}
    )
    t = trade_off(c)
    assert [r.variant for r in t.rows] == ["ckpt", "amp"]
    assert (t["ckpt"].time, t["ckpt"].memory, t["ckpt"].bytes_before, t["ckpt"].bytes_after) == (
        "2.00x slower",
        "4.00x less",
        4096,
        1024,
    )
    assert t["amp"].memory == "same" and t["amp"].time == "not significant"
    md = t.to_markdown()
    assert "| ckpt | plain | 2.00x slower | 4.00x less | 4.00 KiB -> 1.00 KiB |" in md and "CUDA" not in md
    assert t["ckpt"].cuda_peak_after is None and repr(t) == md
    # Against another variant, in the same paired rounds; the whole-step total instead of the peak.
    back = trade_off(c, ["plain"], against="ckpt", field="saved_bytes")
    assert (back["plain"].time, back["plain"].memory) == ("2.00x faster", "4.00x more")
    gpu = trade_off(with_memory(c, {"plain": 8, "ckpt": 4, "amp": 8}, cuda={"plain": 2048, "ckpt": 1024, "amp": 2048}))
    assert gpu["ckpt"].cuda_peak_after == 1024 and "2.00 KiB -> 1.00 KiB" in gpu.to_markdown()
    with pytest.raises(KeyError):
        t["zz"]
    with pytest.raises(ValueError, match="memory=True"):
        trade_off(comparison({"a": 1e-3, "b": 2e-3}, "a"))


def test_median_drift_is_largest_over_smallest():
    c = comparison({"a": 1e-3, "b": 2e-3}, "a")
    drift = median_drift({"cell 1": c["a"], "cell 2": c["b"].measurement})
    assert drift.ratio == pytest.approx(2.0)
    assert "| cell 2 | 2 ms |" in drift.to_markdown() and "| largest / smallest | 2.00x |" in drift.to_markdown()
    with pytest.raises(ValueError, match="at least twice"):
        median_drift({"only": c["a"]})
    with pytest.raises(TypeError, match="Measurement"):
        median_drift({"x": c["a"], "y": 1.0})
