"""tricks_lib.plot: what the pictures must not hide."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tricks_lib.comparing import Budget, compare  # noqa: E402
from tricks_lib.plot import _time_scale, metric_vs_size, speedup_bars  # noqa: E402


def test_verdict_labels_start_past_the_whisker_end():
    a = torch.randn(256, 256)
    cmp = compare(
        {"one": lambda: a @ a, "two": lambda: (a @ a, a @ a)},
        baseline="one",
        budget=Budget(min_rounds=8, min_run_time=0.02),
    )
    fig, ax = plt.subplots()
    speedup_bars(cmp, ax=ax)
    scale, _ = _time_scale(max(r.measurement.median for r in cmp.rows))
    assert len(ax.texts) == len(cmp.rows)
    for text, row in zip(ax.texts, cmp.rows):
        whisker_end = np.percentile(row.measurement.times, 75) / scale
        assert text.xy[0] == pytest.approx(whisker_end), (text.get_text(), text.xy, whisker_end)
    plt.close(fig)


def test_a_series_equal_to_another_stays_visible_and_says_so():
    fig, ax = plt.subplots()
    metric_vs_size(
        [1, 2, 3],
        {"sqrt(n) checkpoints": [1, 2, 3], "every layer": [1, 2, 3], "none": [3, 4, 5]},
        xlabel="depth",
        ylabel="MiB",
        ax=ax,
    )
    lines = ax.get_lines()
    assert [ln.get_linestyle() for ln in lines] == ["-", "--", "-"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[1] == "every layer (same values as sqrt(n) checkpoints)"
    plt.close(fig)
