"""ShuffleNet V2's tables: the paper's ratios, the trend of a measured interval against them, one timed table."""

import math

import pytest
from known_results import known_comparison

from tricks_lib.design.probe_tables import SHUFFLENET_V2_TABLES, paper_throughput_ratios, trend_against_paper
from tricks_lib.measurements import ComparisonRow, Measurement


def _row(speedup, significant, low=None, high=None):
    """A row with the paired interval [low, high] (default: the speedup alone)."""
    m = Measurement(label="x", times=(1.0, 1.0, 1.0), number_per_block=1, device="cpu", num_threads=1)
    return ComparisonRow(
        name="x",
        measurement=m,
        speedup=speedup,
        ci_low=speedup if low is None else low,
        ci_high=speedup if high is None else high,
        significant=significant,
        is_baseline=False,
    )


def test_trend_against_paper_reads_the_interval():
    # The paper's ratio inside a significant interval holds, even where the point estimate is smaller.
    assert trend_against_paper(1.17, _row(1.16, True, 1.10, 1.22)) == "holds"
    assert trend_against_paper(0.75, _row(0.78, True, 0.70, 0.85)) == "holds"
    # The whole interval beyond the paper's ratio (further from 1x): stronger, in either direction.
    assert trend_against_paper(1.17, _row(20.0, True, 18.0, 22.0)) == "stronger"
    assert trend_against_paper(0.75, _row(0.4, True, 0.35, 0.45)) == "stronger"
    # The whole interval between 1x and the paper's ratio: weaker.
    assert trend_against_paper(0.75, _row(0.88, True, 0.85, 0.91)) == "weaker"
    assert trend_against_paper(1.5, _row(1.2, True, 1.1, 1.3)) == "weaker"
    assert trend_against_paper(1.5, _row(1.02, False, 0.95, 1.1)) == "weaker (none significant here)"
    # Significant the other way: inverts.
    assert trend_against_paper(0.75, _row(1.2, True, 1.1, 1.3)) == "inverts"
    # An interval that allows both the paper's ratio and no effect cannot tell; nor can a missing interval.
    assert trend_against_paper(1.1, _row(1.05, False, 0.95, 1.15)) == "not resolved here"
    assert trend_against_paper(1.1, _row(1.05, False, math.nan, math.nan)) == "not resolved here"
    # Rows where the paper measured no difference (G3 at some multipliers): read, never a crash.
    assert trend_against_paper(1.0, _row(0.6, True)) == "no effect in the paper, one here"
    assert trend_against_paper(1.0, _row(0.99, False)) == "no effect in the paper, none here"
    with pytest.raises(ValueError):
        trend_against_paper(0.0, _row(0.6, True))
    with pytest.raises(TypeError):
        trend_against_paper(0.75, 0.6)


def test_paper_throughput_ratios():
    gpu, arm = paper_throughput_ratios("G1", "1:12", 1)
    assert gpu == pytest.approx(748 / 1480) and arm == pytest.approx(57.6 / 76.2)
    assert paper_throughput_ratios("G2", "g=1", 4) == (1.0, 1.0)
    with pytest.raises(KeyError):
        paper_throughput_ratios("G5", "g=1", 1)
    with pytest.raises(KeyError):
        paper_throughput_ratios("G2", "g=3", 1)
    with pytest.raises(ValueError):
        paper_throughput_ratios("G2", "g=2", 3)


def test_probe_table_reads_each_row_against_the_paper_half():
    from tricks_lib.design.probe_tables import ProbeTable, ProbeTrends

    costs = {"1:1": 1e-3, "1:2": 1e-3, "1:6": 2e-3, "1:12": 0.5e-3}
    c = known_comparison(costs, "1:1", label="G1")  # 2 threads, as every known comparison
    counts = {n: 100 for n in costs}
    table = ProbeTable("G1", 1, False, c, counts, {n: 10**6 for n in costs}, {n: 0 for n in costs})
    assert table.paper_ratio("1:6") == paper_throughput_ratios("G1", "1:6", 1)[1]  # the ARM half
    # The paper's ARM half is 0.91x at 1:6 and 0.76x at 1:12: 2x slower is stronger, 2x faster inverts, and
    # equal times (an interval at 1x) cannot tell against the paper's 0.96x at 1:2.
    assert table.trend("1:6") == "stronger" and table.trend("1:12") == "inverts"
    assert table.trend("1:2") == "weaker (none significant here)"
    assert table.trends() == "1:2 weaker (none significant here), 1:6 stronger, 1:12 inverts"
    assert table.note() == f" (trend vs the paper's ARM ratios at 2 threads: {table.trends()})"
    assert len(table.rows()[0]) == 9 and table.rows()[0][-1] == "-"
    assert "trend vs paper ARM" in table._repr_markdown_() and "element-wise (M)" in table._repr_markdown_()
    assert "| G1 x1 | 1:12 |" in ProbeTrends((table,))._repr_markdown_()
    # A second column at another thread count: each row's verdict there, not read against the paper.
    default = known_comparison({"1:1": 1e-3, "1:2": 2e-3, "1:6": 2e-3, "1:12": 2e-3}, "1:1", label="G1")
    both = ProbeTable("G1", 1, False, c, counts, table.mac, table.elementwise, default_threads=default)
    assert both.rows()[3][-1] == "2.00x slower" and len(both.rows()[0]) == 10
    assert "here, 2 threads" in ProbeTrends((both,))._repr_markdown_()
    # Read against the GPU half: the CPU's thread count is not part of what it says.
    gpu = ProbeTable("G1", 1, True, c, counts, table.mac, table.elementwise)
    assert gpu.paper_ratio("1:6") == paper_throughput_ratios("G1", "1:6", 1)[0]
    assert "| here [99% interval] |" in gpu._repr_markdown_() and "thread" not in gpu.note()


def test_every_table_lists_its_rows_in_the_papers_order():
    assert list(SHUFFLENET_V2_TABLES["G1"]) == ["1:1", "1:2", "1:6", "1:12"]
    assert list(SHUFFLENET_V2_TABLES["G4"])[0] == "ReLU + shortcut"
