"""tricks_lib.stats: the pure functions behind "significant", checked without a clock."""

import math

import numpy as np
import pytest

from tricks_lib.stats import median_interval, paired_speedup, replicate_speedups, replicates_agree


def test_median_interval_uses_the_binomial_order_statistics():
    # n = 8: P(Binom(8, 1/2) = 0) = 1/256 <= 0.5% < P(<= 1) = 9/256, so the 99% interval is [x_1, x_8].
    assert median_interval([float(i) for i in range(8)], 0.99) == (0.0, 7.0)
    assert median_interval([float(i) for i in range(7)], 0.99) is None  # 2/128 > 1%: no 99% interval
    # n = 20 at 95%: P(Binom(20, 1/2) <= 5) = 0.0207 <= 2.5% < P(<= 6) = 0.0577, so [x_6, x_15].
    assert median_interval([float(i) for i in range(1, 21)], 0.95) == (6.0, 15.0)


def test_paired_speedup_needs_the_whole_interval_past_the_threshold():
    base = [2e-3] * 10
    assert paired_speedup(base, [1e-3] * 10, 1, 1, 0.03)[3]  # 2x, no noise
    ratio, lo, hi, significant = paired_speedup(base, [1.96e-3] * 10, 1, 1, 0.03)  # 2% only
    assert ratio == pytest.approx(2 / 1.96) and not significant
    assert paired_speedup(base, [1e-3] * 7, 1, 1, 0.03)[3] is False and math.isnan(
        paired_speedup(base[:7], [1e-3] * 7, 1, 1, 0.03)[1]
    )


def test_replicate_speedups_split_the_rounds_in_order():
    base = [1.0, 1.0, 1.0, 1.0, 1.0]
    mine = [0.5, 0.5, 2.0, 2.0, 2.0]
    assert replicate_speedups(base, mine, 1, 1, (2, 3)) == (2.0, 0.5)
    assert replicate_speedups(base, [2.0] * 5, 1, 4, (5,)) == (2.0,)  # per item: 4 items in 2 s vs 1 in 1 s
    with pytest.raises(ValueError, match="do not match"):
        replicate_speedups(base, mine, 1, 1, (2, 2))


def test_replicates_agree_only_when_each_is_past_the_threshold_on_one_side():
    assert replicates_agree((1.2, 1.1, 1.05), 0.03)
    assert replicates_agree((0.8, 0.9), 0.03)
    assert not replicates_agree((1.2, 1.02, 1.3), 0.03)  # one replicate within 3%
    assert not replicates_agree((1.2, 0.8), 0.03)  # opposite directions
    assert replicates_agree((), 0.03) and replicates_agree((1.0,), 0.03)  # nothing to agree with


def test_the_speedup_lies_inside_the_interval_printed_beside_it():
    # Replicates at different machine levels (each a fresh build): the ratio of the pooled medians can
    # fall outside the interval of the paired per-round ratios ("x1.09 [0.91, 0.98]" was printed).
    rng = np.random.default_rng(0)
    outside_before = 0
    for _ in range(300):
        base, var = [], []
        for level in rng.uniform(1.0, 3.0, size=3):
            shift = rng.uniform(0.8, 1.25)
            b = level * rng.lognormal(0.0, 0.05, size=10)
            base += list(b)
            var += list(b * shift * rng.lognormal(0.0, 0.05, size=10) * rng.uniform(0.7, 1.4))
        speedup, lo, hi, _ = paired_speedup(base, var, 1, 1, 0.03)
        assert lo <= speedup <= hi, (speedup, lo, hi)
        ratio_of_medians = float(np.median(base) / np.median(var))
        outside_before += not lo <= ratio_of_medians <= hi
    assert outside_before > 0  # the data do contain the case the old reading printed
