"""tricks_lib.summary_diff (benchmarks/verdict_flips.py, `python -m tricks_lib diff`): direction and significance flips between two runs' summaries."""

from tricks_lib import summary_diff


def summary(*rows):
    return {
        "measurements": [{"notebook": n, "trick": t, "variant": v, "verdict": verdict} for n, t, v, verdict in rows]
    }


def test_flips_are_counted_by_kind():
    first = summary(
        ("01", "decode", "PIL", "baseline"),
        ("01", "decode", "cv2", "1.80x faster"),
        ("01", "decode", "png", "2.00x slower"),
        ("02", "amp", "bf16", "not significant"),
        ("02", "amp", "fp16", "1.10x faster (suspect: does more work)"),
        ("03", "x", "gone", "1.5x faster"),
    )
    second = summary(
        ("01", "decode", "PIL", "baseline"),
        ("01", "decode", "cv2", "1.75x faster"),
        ("01", "decode", "png", "1.20x faster"),
        ("02", "amp", "bf16", "1.04x slower"),
        ("02", "amp", "fp16", "1.12x faster"),
    )
    report = summary_diff.compare_summaries(first, second)
    assert report["rows_compared"] == 4  # baselines and rows missing from one run are not compared
    assert report["only_in_one_run"] == 1
    assert [f["variant"] for f in report["direction_flips"]] == ["png"]
    assert [f["variant"] for f in report["significance_flips"]] == ["bf16"]
    assert report["significance_flip_rate"] == 0.25


def test_verdict_classes():
    assert summary_diff.verdict_class("1.20x faster") == "faster"
    assert summary_diff.verdict_class("3.00x slower (suspect: x)") == "slower"
    assert summary_diff.verdict_class("not significant") == "not significant"
    assert summary_diff.verdict_class("not significant (fresh replicates disagree: 0.90x, 1.10x)") == "not significant"
    assert summary_diff.verdict_class("baseline") is None and summary_diff.verdict_class(None) is None


def test_diff_command_lists_the_changed_verdicts_of_two_folders(tmp_path, capsys):
    import json

    from tricks_lib.__main__ import main

    for name, verdict, table in (("cpu", "not significant", "1.40x slower"), ("gpu", "2.10x faster", "1.30x faster")):
        (tmp_path / name).mkdir()
        doc = summary(("02", "amp", "bf16", verdict), ("02", "amp", "fp32", "baseline"))
        doc["machine_summary"] = f"{name} machine"
        doc["verdicts"] = [{"notebook": "02", "trick": "channels_last", "variant": "verdict", "verdict": table}]
        (tmp_path / name / "summary.json").write_text(json.dumps(doc))
    assert main(["diff", str(tmp_path / "cpu"), str(tmp_path / "gpu")]) == 0
    out = capsys.readouterr().out
    assert "First run: cpu machine" in out and "Second run: gpu machine" in out
    assert "| 02 | amp | bf16 | not significant | 2.10x faster |" in out  # significance changed
    assert "| 02 | channels_last | verdict | 1.40x slower | 1.30x faster |" in out  # direction changed
    assert "2 verdicts in both runs; 1 changed direction, 1 changed significance" in out
    assert main(["diff", str(tmp_path / "cpu"), str(tmp_path / "nowhere")]) == 2
    assert "no summary here" in capsys.readouterr().err
