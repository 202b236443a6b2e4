"""tricks_lib.design.distill: the paired reading of distillation gains over seeds (notebook 04 writes the loss out)."""

import pytest

from tricks_lib.design.distill import paired_gain_verdict


def test_paired_gain_verdict_reads_the_spread_not_the_mean():
    assert paired_gain_verdict([0.05, 0.06, 0.07])[0] == "helps"
    assert paired_gain_verdict([-0.05, -0.06, -0.07])[0] == "hurts"
    # a positive mean whose seeds disagree is not a verdict
    verdict, mean, low, high = paired_gain_verdict([0.10, -0.02, 0.01])
    assert verdict == "no significant effect" and mean > 0 and low < 0 < high
    # every seed positive but too spread for 3 seeds at 95%: still no verdict
    assert paired_gain_verdict([0.001, 0.002, 0.2])[0] == "no significant effect"
    _, mean, low, high = paired_gain_verdict([1.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(12.706 * 1.0, rel=1e-3)


def test_paired_gain_verdict_validates():
    with pytest.raises(ValueError):
        paired_gain_verdict([0.1])
    with pytest.raises(ValueError):
        paired_gain_verdict([0.1, 0.2], confidence=1.0)
    with pytest.raises(ValueError):
        paired_gain_verdict([0.1, float("nan")])
    with pytest.raises(TypeError):
        paired_gain_verdict([0.1, 0.2], confidence="high")
    with pytest.raises(TypeError):
        paired_gain_verdict(["a", "b"])


def test_distillation_gains_read_each_scenario_from_paired_seeds():
    from tricks_lib.design.distill import distillation_gains

    acc = {
        "teacher": [0.95, 0.96, 0.94],
        "few, alone": [0.50, 0.55, 0.52],
        "few, distilled": [0.70, 0.74, 0.71],  # +0.20, +0.19, +0.19: helps
        "all, alone": [0.90, 0.91, 0.92],
        "all, distilled": [0.91, 0.90, 0.92],  # +0.01, -0.01, 0: no significant effect
    }
    gains = distillation_gains(acc, ("few", "all"), confidence=0.95)
    assert gains.gain("few") == pytest.approx([0.20, 0.19, 0.19])
    assert gains.verdict("few")[0] == "helps" and gains.verdict("all")[0] == "no significant effect"
    assert gains.summary("few").startswith("helps: +19.3 accuracy points (95% interval")
    assert "| teacher | 95.0% ± 1.0% | 94.0% - 96.0% |" in gains._repr_markdown_()
    with pytest.raises(KeyError):
        distillation_gains(acc, ("none",))
    with pytest.raises(ValueError):
        distillation_gains({**acc, "teacher": [0.9]}, ("few",))
