"""tricks_lib.report.summary_diff (benchmarks/verdict_flips.py, `python -m tricks_lib diff`): direction and significance flips between two runs' summaries."""

from tricks_lib.report import summary_diff as summary_diff


def summary(*rows):
    """A summary.json with rows (notebook, trick, variant, verdict text, outcome): the diff reads the outcome."""
    return {
        "measurements": [
            {"notebook": n, "trick": t, "variant": v, "verdict": verdict, "outcome": outcome}
            for n, t, v, verdict, outcome in rows
        ]
    }


def test_flips_are_counted_by_kind():
    first = summary(
        ("01", "decode", "PIL", "baseline", "baseline"),
        ("01", "decode", "cv2", "1.80x faster", "faster"),
        ("01", "decode", "png", "2.00x slower", "slower"),
        ("02", "amp", "bf16", "not significant", "not significant"),
        ("02", "amp", "fp16", "1.10x faster (suspect: does more work)", "suspect"),
        ("03", "x", "gone", "1.5x faster", "faster"),
        ("04", "memory", "checkpointing", "3.0x less", None),  # not a comparison: never compared
    )
    second = summary(
        ("01", "decode", "PIL", "baseline", "baseline"),
        ("01", "decode", "cv2", "1.75x faster", "faster"),
        ("01", "decode", "png", "1.20x faster", "faster"),
        ("02", "amp", "bf16", "1.04x slower", "slower"),
        ("02", "amp", "fp16", "1.12x faster", "faster"),
        ("04", "memory", "checkpointing", "2.0x more", None),
    )
    report = summary_diff.compare_summaries(first, second)
    assert report["rows_compared"] == 4  # baselines, rows without an outcome and rows of one run are not compared
    assert report["only_in_one_run"] == 1
    assert [f["variant"] for f in report["direction_flips"]] == ["png"]
    # A suspect speedup is no speedup: it flips significance against a plain faster, never direction.
    assert [f["variant"] for f in report["significance_flips"]] == ["bf16", "fp16"]
    assert report["significance_flip_rate"] == 0.5


def test_verdict_classes_come_from_the_outcome_never_the_text():
    assert summary_diff.verdict_class({"outcome": "faster", "verdict": "1.20x slower"}) == "faster"
    assert summary_diff.verdict_class({"outcome": "slower"}) == "slower"
    assert summary_diff.verdict_class({"outcome": "not significant"}) == "not significant"
    assert (
        summary_diff.verdict_class({"outcome": "suspect", "verdict": "3.00x faster (suspect: x)"}) == "not significant"
    )
    assert summary_diff.verdict_class({"outcome": "baseline"}) is None
    assert summary_diff.verdict_class({"outcome": None, "verdict": "1.20x faster"}) is None


def test_an_older_summary_is_refused_in_one_line(tmp_path, capsys):
    import json

    from tricks_lib.__main__ import main

    for name in ("old", "new"):
        (tmp_path / name).mkdir()
    old = {"measurements": [{"notebook": "02", "trick": "amp", "variant": "bf16", "verdict": "1.20x faster"}]}
    (tmp_path / "old" / "summary.json").write_text(json.dumps(old))
    new = summary(("02", "amp", "bf16", "1.20x faster", "faster"))
    (tmp_path / "new" / "summary.json").write_text(json.dumps(new | {"machine_summary": "m"}))
    assert main(["diff", str(tmp_path / "old"), str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert "written by an older tricks_lib" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_malformed_summary_is_refused_in_one_line(tmp_path, capsys):
    import json

    from tricks_lib.__main__ import main

    good = summary(("02", "amp", "bf16", "1.20x faster", "faster")) | {"machine_summary": "m"}
    for name, doc in (("torn", None), ("rowless", {**good, "measurements": [{"trick": "amp"}]}), ("good", good)):
        (tmp_path / name).mkdir()
        text = '{"measurements": [' if doc is None else json.dumps(doc)
        (tmp_path / name / "summary.json").write_text(text)
    for bad, says in (("torn", "not readable JSON"), ("rowless", "measurements row 0 is not a result row")):
        assert main(["diff", str(tmp_path / bad), str(tmp_path / "good")]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_diff_command_lists_the_changed_verdicts_of_two_folders(tmp_path, capsys):
    import json

    from tricks_lib.__main__ import main

    for name, verdict, table in (("cpu", "not significant", "1.40x slower"), ("gpu", "2.10x faster", "1.30x faster")):
        (tmp_path / name).mkdir()
        outcome = "faster" if "faster" in verdict else "not significant"  # the outcome each verdict was written from
        doc = summary(("02", "amp", "bf16", verdict, outcome), ("02", "amp", "fp32", "baseline", "baseline"))
        doc["machine_summary"] = f"{name} machine"
        table_outcome = "faster" if "faster" in table else "slower"
        doc["verdicts"] = [
            {
                "notebook": "02",
                "trick": "channels_last",
                "variant": "verdict",
                "verdict": table,
                "outcome": table_outcome,
            }
        ]
        (tmp_path / name / "summary.json").write_text(json.dumps(doc))
    assert main(["diff", str(tmp_path / "cpu"), str(tmp_path / "gpu")]) == 0
    out = capsys.readouterr().out
    assert "First run: cpu machine" in out and "Second run: gpu machine" in out
    assert "| 02 | amp | bf16 | not significant | 2.10x faster |" in out  # significance changed
    assert "| 02 | channels_last | verdict | 1.40x slower | 1.30x faster |" in out  # direction changed
    assert "2 verdicts in both runs; 1 changed direction, 1 changed significance" in out
    assert main(["diff", str(tmp_path / "cpu"), str(tmp_path / "nowhere")]) == 2
    assert "no summary here" in capsys.readouterr().err


def interval_row(variant, speedup, low, high, verdict="1.20x faster"):
    return {
        "notebook": "02",
        "trick": "t",
        "variant": variant,
        "verdict": verdict,
        "outcome": "not significant" if verdict == "not significant" else "faster",
        "speedup": speedup,
        "speedup_low": low,
        "speedup_high": high,
    }


def test_expected_flips_come_from_rows_near_the_threshold():
    far = interval_row("far", 2.0, 1.8, 2.2)  # clears 5% by far: any rerun agrees
    null = interval_row("null", 1.0, 0.98, 1.02, "not significant")  # 1x inside a narrow interval: never clears
    edge = interval_row("edge", 1.10, 1.05, 1.15)  # its low end sits on the 5% edge: a coin toss
    text = {
        "notebook": "02",
        "trick": "t",
        "variant": "text",
        "verdict": "2.00x faster",
        "outcome": "faster",
    }  # no interval
    report = summary_diff.expected_significance_flips({"measurements": [far, null, edge, text]})
    assert report["rows"] == 3 and report["rows_without_interval"] == 1
    assert 0.49 < report["expected_flips"] < 0.51  # 2 p (1 - p) with p = 1/2 for the edge row, ~0 for the others
    assert abs(report["expected_flip_rate"] - report["expected_flips"] / 3) < 1e-12
    alone = summary_diff.expected_significance_flips({"measurements": [far, null]})
    assert alone["expected_flips"] < 1e-6


def test_narrower_intervals_lower_the_expected_flips():
    # Effects of 17-25% read with wide intervals (+-15%): uncertain now, clear once the intervals narrow.
    rows = [interval_row(f"r{i}", s, s / 1.15, s * 1.15) for i, s in enumerate((1.2, 1.25, 0.83, 0.8))]
    doc = {"measurements": rows}
    rates = [
        summary_diff.expected_significance_flips(doc, width_scale=w)["expected_flip_rate"] for w in (1.0, 0.5, 0.25)
    ]
    assert rates[0] > rates[1] > rates[2] > 0
    only = summary_diff.expected_significance_flips(doc, keys=[("02", "t", "r0"), ("02", "t", "missing")])
    assert only["rows"] == 1


def test_expected_flips_refuse_bad_arguments():
    import pytest

    with pytest.raises(ValueError, match="width_scale"):
        summary_diff.expected_significance_flips({}, width_scale=2)
    with pytest.raises(TypeError, match="width_scale"):
        summary_diff.expected_significance_flips({}, width_scale="half")
    with pytest.raises(ValueError, match="min_effect"):
        summary_diff.expected_significance_flips({}, min_effect=1.5)
    with pytest.raises(TypeError, match="min_effect"):
        summary_diff.expected_significance_flips({}, min_effect=True)


def test_the_report_puts_the_expected_rate_beside_the_observed_one():
    first = {"measurements": [interval_row("edge", 1.10, 1.05, 1.15)]}
    second = {"measurements": [interval_row("edge", 1.02, 0.97, 1.07, "not significant")]}
    report = summary_diff.compare_summaries(first, second)
    assert report["significance_flip_rate"] == 1.0
    assert 0.49 < report["expected_significance_flip_rate"]["first"] < 0.51
    assert report["rows_with_interval"] == {"first": 1, "second": 1}
    assert 0.49 < report["expected_significance_flips"]["first"] < 0.51
    assert "would change the significance of about 0.5 of the 1 rows with an interval" in summary_diff.diff_markdown(
        report
    )


def test_the_report_says_first_when_the_runs_differ_in_mode_machine_or_torch():
    rows = [("01", "decode", "cv2", "1.80x faster", "faster")]
    quick = {**summary(*rows), "mode": "quick", "machine": {"device_name": "Xeon", "num_threads": 2, "torch": "2.14.1"}}
    full = {
        **summary(*rows),
        "mode": "full",
        "machine": {"device_name": "NVIDIA H100", "num_threads": 2, "torch": "2.15.0"},
    }
    report = summary_diff.compare_summaries(quick, full)
    assert report["settings_differ"] == [
        "mode: quick -> full",
        "device: Xeon -> NVIDIA H100",
        "torch: 2.14.1 -> 2.15.0",
    ]
    text = summary_diff.diff_markdown(report)
    assert text.index("Not a rerun of the same setup") < text.index("verdicts in both runs")
    same = summary_diff.compare_summaries(quick, quick)
    assert same["settings_differ"] == [] and "Not a rerun" not in summary_diff.diff_markdown(same)
