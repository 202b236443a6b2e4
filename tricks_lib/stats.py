"""The statistics behind "significant": pure functions of block times, testable without a clock.

A comparison pairs the per-round block times of two variants (both blocks of a round saw the same
machine state) and reads the distribution-free interval of the median per-round speedup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "CONFIDENCE",
    "DEFAULT_MIN_EFFECT",
    "MIN_BLOCKS_FOR_SPREAD",
    "MIN_ROUNDS_FOR_VERDICT",
    "NOISE_THRESHOLD",
    "median_interval",
    "paired_speedup",
    "replicate_speedups",
    "replicates_agree",
]

# IQR/median above this marks a measurement as noisy (the same threshold torch.utils.benchmark warns at).
NOISE_THRESHOLD = 0.10
# Differences smaller than this are never called a speedup, however consistent: "significant" should
# mean "a rerun says the same", and the 99% paired interval only sees the noise between the rounds of
# one run. Between two full runs of the main command on a shared 2-core VM (runs D and E of session 4,
# 149 speedups in both), a speedup moved by a median of 4.2% (a quarter of them by 8% or more): with
# a 3% floor, 11 of 167 verdicts changed between significant and not. A 5% floor keeps the median
# rerun movement inside it; larger effects that move more are what replicates are for.
DEFAULT_MIN_EFFECT = 0.05
# Two-sided confidence level of the paired test behind "significant".
CONFIDENCE = 0.99
# The fewest paired rounds whose order-statistic interval for the median reaches CONFIDENCE.
MIN_ROUNDS_FOR_VERDICT = 8
# The fewest timed blocks whose IQR says anything about spread: one or two blocks have an IQR that
# reflects how many blocks there were, not how noisy the machine is.
MIN_BLOCKS_FOR_SPREAD = 3


def median_interval(values: list[float], confidence: float) -> tuple[float, float] | None:
    """Distribution-free confidence interval for the median (order statistics of a binomial).

    None when there are too few values to reach ``confidence`` at all.
    """
    n = len(values)
    xs = sorted(values)
    alpha = 1.0 - confidence
    # Largest k with P(Binom(n, 1/2) < k) <= alpha/2: then [x_(k), x_(n-k+1)] covers the median.
    cdf, k = 0.0, 0
    for j in range(n + 1):
        p = math.comb(n, j) / 2.0**n
        if cdf + p > alpha / 2:
            break
        cdf += p
        k = j + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def paired_speedup(
    base_times: Sequence[float],
    times: Sequence[float],
    base_items: int,
    items: int,
    min_effect: float,
) -> tuple[float, float, float, bool]:
    """Speedup of a variant over a reference from their paired per-round block times.

    Returns (speedup, interval low, interval high, significant). The speedup is the median of the
    per-round paired speedups and the interval its ``CONFIDENCE`` distribution-free interval, so the
    speedup always lies inside the interval printed beside it. (The ratio of the two medians can lie
    outside it: with replicates whose machine state differs, the pooled medians mix stretches that
    the paired ratios keep apart; a table that printed "x1.09 [0.91, 0.98]" contradicted itself.)
    "Significant" needs the whole interval at least ``min_effect`` away from 1x, and the ratio of
    medians on the same side as well: a steady bias of a percent or two is consistent enough to exclude
    1x, yet it is not a speedup. Times are divided by the items each call processed, so different batch
    sizes compare by throughput. With too few rounds for an interval, the speedup is the ratio of
    medians and nothing is significant.
    """
    base_median = float(np.median(base_times)) / base_items
    median = float(np.median(times)) / items
    ratio_of_medians = base_median / median if median > 0 else math.inf
    # Paired per-round log speedups: both blocks of a round saw the same machine state.
    logs = [math.log((b / base_items) / (v / items)) for b, v in zip(base_times, times) if b > 0 and v > 0]
    interval = median_interval(logs, CONFIDENCE)
    if interval is None:
        return ratio_of_medians, math.nan, math.nan, False
    speedup = math.exp(float(np.median(logs)))
    lo, hi = math.exp(interval[0]), math.exp(interval[1])
    faster, slower = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
    significant = (lo >= faster and ratio_of_medians >= faster) or (hi <= slower and ratio_of_medians <= slower)
    return speedup, lo, hi, significant


def replicates_agree(speedups: Sequence[float], min_effect: float) -> bool:
    """True when every replicate's speedup lies at least ``min_effect`` from 1x, all on the same side.

    A replicate is a stretch of rounds run on freshly built variants (new models, tensors, loaders).
    The paired interval only sees the noise between rounds of one run; state that a run builds once
    (where its tensors landed in memory, which worker started first) moves a whole run's result, and
    a rerun gets a different draw. Requiring each fresh replicate to show the difference on its own
    rules out what a rebuild inside the process redraws; state drawn once per process (worker
    start-up, CPU placement) needs fresh processes, which this does not give. With fewer than two
    replicates there is nothing to agree, so this is True.
    """
    if len(speedups) < 2:
        return True
    faster, slower = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
    return all(s >= faster for s in speedups) or all(s <= slower for s in speedups)


def replicate_speedups(
    base_times: Sequence[float],
    times: Sequence[float],
    base_items: int,
    items: int,
    rounds_per_replicate: Sequence[int],
) -> tuple[float, ...]:
    """Each replicate's median paired speedup, as ``paired_speedup`` reads it (block times in round order).

    Raises:
        ValueError: the replicate round counts do not add up to the number of paired blocks.
    """
    if sum(rounds_per_replicate) != len(base_times) or len(base_times) != len(times):
        raise ValueError(
            f"replicates of {list(rounds_per_replicate)} rounds do not match {len(base_times)} and {len(times)} blocks"
        )
    out, start = [], 0
    for n in rounds_per_replicate:
        pairs = zip(base_times[start : start + n], times[start : start + n])
        logs = [math.log((b / base_items) / (v / items)) for b, v in pairs if b > 0 and v > 0]
        out.append(math.exp(float(np.median(logs))) if logs else math.nan)
        start += n
    return tuple(out)
