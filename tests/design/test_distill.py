"""distillation_loss: hard term = cross-entropy, soft term = KL at temperature T times T^2."""

import pytest
import torch
import torch.nn.functional as F

from tricks_lib.design.distill import distillation_loss, paired_gain_verdict


def _logits(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)


def _kl_by_hand(student, teacher, temperature):
    p = torch.softmax(teacher / temperature, dim=1)
    q = torch.softmax(student / temperature, dim=1)
    return (p * (p.log() - q.log())).sum(dim=1).mean()


def test_alpha_zero_is_cross_entropy():
    s, t, y = _logits()
    torch.testing.assert_close(distillation_loss(s, t, y, temperature=4.0, alpha=0.0), F.cross_entropy(s, y))


def test_soft_term_is_kl_times_t_squared():
    s, t, y = _logits(1)
    for temperature in (1.0, 3.0, 8.0):
        expected = temperature**2 * _kl_by_hand(s, t, temperature)
        torch.testing.assert_close(distillation_loss(s, t, y, temperature=temperature, alpha=1.0), expected)
        torch.testing.assert_close(distillation_loss(s, t, None, temperature=temperature, alpha=1.0), expected)


def test_mixture_and_no_gradient_to_teacher():
    s, t, y = _logits(2)
    s.requires_grad_(True)
    t.requires_grad_(True)
    loss = distillation_loss(s, t, y, temperature=2.0, alpha=0.3)
    expected = 0.3 * 4.0 * _kl_by_hand(s, t, 2.0) + 0.7 * F.cross_entropy(s, y)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert s.grad is not None and t.grad is None


def test_student_equal_to_teacher_has_zero_soft_loss():
    s, _, y = _logits(3)
    assert distillation_loss(s, s.clone(), y, temperature=5.0, alpha=1.0).abs() < 1e-6


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(temperature):
    s, t, y = _logits()
    with pytest.raises(ValueError):
        distillation_loss(s, t, y, temperature=temperature, alpha=0.5)


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_bad_alpha(alpha):
    s, t, y = _logits()
    with pytest.raises(ValueError):
        distillation_loss(s, t, y, temperature=2.0, alpha=alpha)


def test_missing_targets_need_alpha_one_and_shapes_must_match():
    s, t, y = _logits()
    with pytest.raises(ValueError):
        distillation_loss(s, t, None, temperature=2.0, alpha=0.5)
    with pytest.raises(ValueError):
        distillation_loss(s, t[:, :4], y, temperature=2.0, alpha=0.5)
    with pytest.raises(TypeError):
        distillation_loss(s, t, y, temperature="2", alpha=0.5)


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
