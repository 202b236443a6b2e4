"""benchmarks/verdict_flips.py: direction and significance flips between two runs' summaries."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "verdict_flips", Path(__file__).resolve().parent.parent / "benchmarks" / "verdict_flips.py"
)
verdict_flips = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict_flips)


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
    report = verdict_flips.compare_runs(first, second)
    assert report["rows_compared"] == 4  # baselines and rows missing from one run are not compared
    assert report["only_in_one_run"] == 1
    assert [f["variant"] for f in report["direction_flips"]] == ["png"]
    assert [f["variant"] for f in report["significance_flips"]] == ["bf16"]
    assert report["significance_flip_rate"] == 0.25


def test_verdict_classes():
    assert verdict_flips.verdict_class("1.20x faster") == "faster"
    assert verdict_flips.verdict_class("3.00x slower (suspect: x)") == "slower"
    assert verdict_flips.verdict_class("not significant") == "not significant"
    assert verdict_flips.verdict_class("not significant (fresh replicates disagree: 0.90x, 1.10x)") == "not significant"
    assert verdict_flips.verdict_class("baseline") is None and verdict_flips.verdict_class(None) is None
