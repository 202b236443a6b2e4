"""tricks_lib.report.verdicts: the verdict table and the reading helpers, on results with known numbers."""

import dataclasses
import json

import pytest
import torch
from known_results import known_comparison as comparison

from tricks_lib.compiling import CompileCost
from tricks_lib.measurements import Measurement
from tricks_lib.memory import MemoryReport
from tricks_lib.outcome import Outcome
from tricks_lib.report.results import load_records
from tricks_lib.report.verdicts import VerdictTable, median_drift, read_variants, trade_off
from tricks_lib.training.steps import autocast_dtype


def test_readings_of_a_comparison_on_known_times():
    c = comparison({"eager": 4e-3, "compiled": 1e-3, "same": 4e-3}, "eager")
    assert c["compiled"].verdict == "4.00x faster" and c["compiled"].outcome is Outcome.FASTER
    assert c.versus("eager", "compiled").verdict == "4.00x slower"
    assert c.versus("eager", "compiled").outcome is Outcome.SLOWER
    assert c["same"].verdict == "not significant" and c["same"].outcome is Outcome.NOT_SIGNIFICANT
    assert c["eager"].outcome is Outcome.BASELINE
    assert c.versus("compiled", "same").speedup == pytest.approx(4.0)
    assert c.fastest() == ("compiled", True)
    tie = comparison({"a": 1e-3, "b": 1.01e-3}, "a")
    assert tie.fastest() == ("a", False)  # 1% is within the 3% threshold: no clear winner
    # Throughput: 8 items in 2 ms beats 1 item in 1 ms.
    per_item = comparison({"small": 1e-3, "big": 2e-3}, "small", items={"small": 1, "big": 8})
    assert per_item.fastest() == ("big", True) and per_item["big"].verdict == "4.00x faster"


def test_a_suspect_row_has_its_own_outcome_and_says_why():
    c = comparison({"light": 2e-3, "heavy": 1e-3}, "light")
    suspect = dataclasses.replace(c["heavy"], suspect="does more work than 'light'")
    assert suspect.outcome is Outcome.SUSPECT and suspect.outcome is not Outcome.FASTER
    assert suspect.verdict == "2.00x faster (suspect: does more work than 'light')"
    assert suspect.summary_row().outcome == "suspect"


def test_break_even_only_when_the_compiled_call_is_faster():
    cost = CompileCost(10.0005, 1.0005, 1.0, 12.0, 3.0, compiled=lambda: None, namespace={})
    c = comparison({"eager": 4e-3, "compiled": 1e-3}, "eager")
    # (first - compiled) / (eager - compiled), rounded up: 9.9995 / 0.003 = 3333.2, 0.9995 / 0.003 = 333.2.
    paid = cost.break_even(c, "compiled", "eager")
    assert (paid.cold, paid.warm, paid.pays_off) == (3334, 334, True)
    assert paid.text() == "pays off after 3,334 calls cold, 334 warm" == repr(paid)
    assert paid.text(unit="steps") == "pays off after 3,334 steps cold, 334 warm"
    slower = comparison({"eager": 1e-3, "compiled": 4e-3}, "eager")
    assert not cost.break_even(slower, "compiled", "eager").pays_off
    same = comparison({"eager": 1e-3, "compiled": 1e-3}, "eager")
    never = cost.break_even(same, "compiled", "eager")
    assert (never.cold, never.warm, never.text()) == (None, None, "never pays off here")
    with pytest.raises(ValueError, match="what is counted"):
        paid.text(unit=" ")
    with pytest.raises(TypeError, match="unit"):
        paid.text(unit=None)
    with pytest.raises(KeyError, match="no variant"):
        cost.break_even(c, "compiled", "missing")


def test_ratio_to_says_it_was_not_tested():
    one = Measurement("one process", (2e-3, 2e-3, 2e-3), 1, "cpu", 2, items=64)
    two = Measurement("two ranks", (2.5e-3, 2.5e-3, 2.5e-3), 1, "cpu", 1, items=128)
    # 128 items in 2.5 ms against 64 in 2 ms: 1.6x the throughput.
    assert two.ratio_to(one) == "1.60x the items/s of one process (separate runs, not tested)"
    plain = Measurement("plain", (4e-3,), 1, "cpu", 2)
    assert two.ratio_to(plain) == "1.60x the calls/s of plain (separate runs, not tested)"
    with pytest.raises(TypeError, match="Measurement"):
        two.ratio_to(1.0)
    with pytest.raises(ValueError, match="median of zero"):
        two.ratio_to(Measurement("zero", (0.0,), 1, "cpu", 2))


def test_memory_change_in_words():
    def report(saved, peak=None):
        return MemoryReport("x", "cpu", saved_bytes=saved, saved_tensors=1, peak_saved_bytes=peak or saved)

    assert report(1024).change_from(report(4096)) == "4.00x less"
    assert report(1536).change_from(report(1024)) == "1.50x more"
    assert report(1024).change_from(report(1024)) == "same"
    assert report(0).change_from(report(4096)) == "none kept (was 4.00 KiB)"
    assert report(4096, 1024).change_from(report(4096, 4096)) == "4.00x less"  # the peak, by default
    assert report(4096, 1024).change_from(report(4096, 4096), field="saved_bytes") == "same"
    with pytest.raises(ValueError, match="CUDA only"):
        report(1).change_from(report(1), field="peak_allocated_bytes")
    with pytest.raises(ValueError, match="byte count"):
        report(1).change_from(report(1), field="label")
    with pytest.raises(TypeError, match="MemoryReport"):
        report(1).change_from(1024)


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
    assert "| torch.compile | compiled: 4.00x faster than eager | short jobs |" in md
    assert "| eager against compiled | eager: 4.00x slower than compiled | - |" in md
    assert "| the row itself | compiled: 4.00x faster; 2 MiB saved | - |" in md
    shown, metadata = table._repr_markdown_()
    assert shown == md and "<td>a computed fact</td>" in table.to_html()
    stored = metadata["tricks_lib"]["verdict_rows"]
    assert [r["outcome"] for r in stored] == ["faster", "slower", "faster", None]
    assert stored[1]["source"] == {
        "comparison": "c",
        "reference": "compiled",
        "outcomes": {"eager": "slower"},
        "speedups": {"eager": pytest.approx(0.25)},
    }
    assert stored[2]["source"]["comparison"] is None and stored[3]["source"] is None
    records = load_records(tmp_path / "records.jsonl")
    assert [r.kind for r in records] == ["verdict"] * 4
    assert records[0].summary[0]["verdict"] == "compiled: 4.00x faster than eager" and records[0].summary[0][
        "speedup"
    ] == pytest.approx(4)
    json.dumps([r.to_dict() for r in records], allow_nan=False)


def test_verdict_table_bad_input():
    table = VerdictTable(record_rows=False)
    c = comparison({"a": 1e-3, "b": 2e-3}, "a")
    with pytest.raises(ValueError, match="not both"):
        table.add("x", c, "-", variant="b", variants=("b",))
    with pytest.raises(ValueError, match="Comparison only"):
        table.add("x", c["b"], "-", variant="b")
    with pytest.raises(ValueError, match="no variant to read"):
        table.add("x", c, "-", variants=("a",))
    with pytest.raises(KeyError):
        table.add("x", c, "-", against="zz")
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
    assert row.measured == "b: 2.00x faster than a (each replicate: 1.98x, 2.00x, 2.02x); more"
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
    assert "| b | 4.00x less | b: 2.00x faster than a | never |" in table.to_markdown()
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


def test_verdict_rows_carry_the_outcome_they_were_read_from(monkeypatch, tmp_path):
    monkeypatch.delenv("TRICKS_RESULTS", raising=False)
    c = comparison({"base": 2e-3, "fast": 1e-3, "slow": 4e-3, "same": 2e-3}, "base")
    table = VerdictTable()
    rows = [table.add(n, c, "-", variant=n) for n in ("fast", "slow", "same")]
    rows.append(table.add("slow against fast", c, "-", variant="slow", against="fast"))
    rows.append(table.add("a sentence", "computed elsewhere", "-"))
    assert [r.outcome for r in rows] == [Outcome.FASTER, Outcome.SLOWER, Outcome.NOT_SIGNIFICANT, Outcome.SLOWER, None]
    assert [r.summary_rows()[0].outcome for r in rows] == ["faster", "slower", "not significant", "slower", None]


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


def test_a_table_that_records_results_records_each_one_once_beside_its_rows(monkeypatch, tmp_path):
    # One call per trick: the row and the measurement it reads, recorded together where the trick is measured.
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    c = comparison({"base": 2e-3, "fast": 1e-3, "slow": 4e-3}, "base")
    table = VerdictTable(record_results=True)
    table.add("fast", c, "-", variant="fast")
    table.add("slow", c, "-", variant="slow")  # the same comparison: not recorded again
    table.add("a row alone", c["fast"], "-")  # a row is not a measurement of its own
    records = load_records(tmp_path / "records.jsonl")
    assert [(r.trick, r.kind) for r in records] == [
        ("fast", "comparison"),
        ("fast", "verdict"),
        ("slow", "verdict"),
        ("a row alone", "verdict"),
    ]
    plain = VerdictTable()
    plain.add("fast again", c, "-", variant="fast")  # the default: the notebook records its results itself
    assert [r.kind for r in load_records(tmp_path / "records.jsonl")][4:] == ["verdict"]
    with pytest.raises(TypeError, match="record_results must be True or False"):
        VerdictTable(record_results=1)


def test_a_table_records_every_result_even_when_an_earlier_one_was_freed(monkeypatch, tmp_path):
    # Results are told apart by identity; a freed result's id can be reused by the next one, which must still
    # be recorded (the table keeps what it recorded alive, so no two of them ever share an id).
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    table = VerdictTable(record_results=True)
    for i in range(40):  # each comparison is a temporary, freed after its add()
        table.add(f"trick {i}", comparison({"base": 2e-3, "fast": 1e-3}, "base"), "-", variant="fast")
    kinds = [(r.trick, r.kind) for r in load_records(tmp_path / "records.jsonl") if r.kind == "comparison"]
    assert kinds == [(f"trick {i}", "comparison") for i in range(40)]


def test_a_row_for_several_variants_reads_every_one_from_its_outcome(monkeypatch):
    """The closing row of a sweep: the best significant variant and its verdict first, then every other variant
    under its own outcome, never one variant standing for the whole comparison."""
    monkeypatch.delenv("TRICKS_RESULTS", raising=False)
    # Paired speedups against 'batch 8': 32 -> 1.33x, 128 -> 1.37x, 512 -> 0.99x (within 3%), 1024 -> 0.5x.
    costs = {"batch 8": 1.0, "batch 32": 0.75, "batch 128": 0.73, "batch 512": 1.01, "batch 1024": 2.0}
    c = comparison(costs, "batch 8")
    expected = {"batch 32": "faster", "batch 128": "faster", "batch 512": "not significant", "batch 1024": "slower"}
    assert {n: c[n].outcome.value for n in expected} == expected
    table = VerdictTable(record_rows=False)
    row = table.add("batch size", c, "once the device is saturated")
    assert row.outcome is Outcome.FASTER and row.speedup == pytest.approx(1 / 0.73)
    assert row.measured == (
        "batch 128: 1.37x faster than batch 8 (best); also faster: batch 32 (1.33x); slower: batch 1024 "
        "(2.00x slower); not significant: batch 512"
    )
    for name, outcome in expected.items():  # every variant is named, under the heading of its own outcome
        assert name in row.measured and row.source.to_dict()["outcomes"][name] == outcome
    # No faster variant: the row says so, and its outcome is not significant while one variant is.
    none_faster = table.add("only the others", c, "-", variants=("batch 512", "batch 1024"))
    assert (
        none_faster.measured
        == "none faster than batch 8; slower: batch 1024 (2.00x slower); not significant: batch 512"
    )
    assert none_faster.outcome is Outcome.NOT_SIGNIFICANT and none_faster.speedup is None
    all_slower = table.add("all slower", c, "-", variants=("batch 1024",))
    assert all_slower.measured == "batch 1024: 2.00x slower than batch 8" and all_slower.outcome is Outcome.SLOWER
    # Against another variant: the best of the others against batch 32, from the same paired rounds.
    against = table.add("against 32", c, "-", against="batch 32")
    assert against.measured == (
        "none faster than batch 32; slower: batch 8 (1.33x slower), batch 512 (1.35x slower), "
        "batch 1024 (2.67x slower); not significant: batch 128"
    )
    assert against.outcome is Outcome.NOT_SIGNIFICANT
    assert against.source.reference == "batch 32" and "batch 32" not in against.source.to_dict()["outcomes"]
    # A suspect variant is never the best one.
    suspect = dataclasses.replace(
        c, rows=tuple(dataclasses.replace(r, suspect="does more work") if r.name == "batch 128" else r for r in c.rows)
    )
    reading = read_variants(suspect)
    assert reading.best.name == "batch 32" and "faster but suspect: batch 128" in reading.text()


def test_a_single_variant_row_names_its_subject_so_its_direction_cannot_be_misread(monkeypatch):
    """04's defect: 'depthwise 3x3 vs dense 1x1 | 1.88x faster' when the faster layer was the dense one."""
    monkeypatch.delenv("TRICKS_RESULTS", raising=False)
    c = comparison({"depthwise 3x3": 1.88e-3, "dense 1x1": 1e-3}, "depthwise 3x3")
    table = VerdictTable(record_rows=False)
    assert table.add("depthwise vs dense", c, "-", variant="dense 1x1").measured == (
        "dense 1x1: 1.88x faster than depthwise 3x3"
    )
    flipped = table.add("depthwise vs dense", c, "-", variant="depthwise 3x3", against="dense 1x1")
    assert flipped.measured == "depthwise 3x3: 1.88x slower than dense 1x1" and flipped.outcome is Outcome.SLOWER
    same = comparison({"a": 1e-3, "b": 1.01e-3}, "a")
    assert table.add("tie", same, "-", variant="b").measured == "b vs a: not significant"


def test_a_comparison_reports_each_calls_own_cuda_peak_not_the_process_peak():
    """A CUDA peak read after the model and data were allocated includes them: tables and summaries show the call's
    own peak (above what was allocated when it began), so two variants' peaks compare the calls, not the setup."""
    c = with_memory(comparison({"a": 1e-3, "b": 2e-3}, "a"), {"a": 8, "b": 8}, cuda={"a": 40, "b": 10})
    assert [r.summary_row().peak_allocated_bytes for r in c.rows] == [40, 10]  # 100 bytes were there before
    header, body = c._table()
    column = header.index("peak allocated by the call")
    assert [row[column] for row in body] == ["40 B", "10 B"]
    assert "(40 B above the call's start)" in repr(c.rows[0].memory)
