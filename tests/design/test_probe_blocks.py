"""The ShuffleNet V2 probe networks: FLOP-matched within each table, shapes that run; the paper's tables; the hybrids."""

import math

import pytest
import torch
from known_results import known_comparison
from torch import nn

from tricks_lib.design.flops import count_flops
from tricks_lib.design.probe_blocks import (
    bottleneck_net,
    channel_ratio_net,
    fragment_net,
    group_conv_net,
    probe_input,
    ratio_channels,
    shufflenet_v2_probes,
)
from tricks_lib.design.probe_tables import SHUFFLENET_V2_TABLES, paper_throughput_ratios, trend_against_paper
from tricks_lib.measurements import ComparisonRow, Measurement


@pytest.mark.parametrize("guideline", ["G1", "G2", "G3", "G4"])
@pytest.mark.parametrize("gpu_half", [False, True])
def test_variants_of_one_table_have_the_same_flops(guideline, gpu_half):
    nets = shufflenet_v2_probes(guideline, 1, gpu_half=gpu_half)
    assert list(nets) == list(SHUFFLENET_V2_TABLES[guideline])
    flops = [count_flops(net, probe_input(net, size=8)) for net in nets.values()]
    # every row within 2% of the table's first row (its reference), as the paper's Tables 1-4 intend
    assert all(abs(f / flops[0] - 1) <= 0.02 for f in flops), flops


def test_g1_ratios_and_width():
    assert ratio_channels(1, 32) == (32, 32)
    c1, c2 = ratio_channels(12, 128)
    assert abs(c2 / c1 - 12) / 12 < 0.05 and abs(c1 * c2 - 128 * 128) / (128 * 128) < 0.02
    net = channel_ratio_net(6, 32)
    assert len(net) == 10 and net[0][0].out_channels == net[0][1].in_channels


def test_g2_layers_use_the_groups():
    net = group_conv_net(8, 64)
    assert len(net) == 10 and all(conv.groups == 8 for conv in net)


def test_g3_parallel_branches_read_the_same_input():
    net = fragment_net(2, "parallel", 16, depth=1)
    x = probe_input(net, size=4)
    a, b = net[0].branches
    torch.testing.assert_close(net(x), a(x) + b(x))
    with pytest.raises(ValueError):
        fragment_net(2, "diagonal", 16)


def test_g4_switches_change_the_output_not_the_flops():
    torch.manual_seed(0)
    full = bottleneck_net(8, depth=1)
    bare = bottleneck_net(8, relu=False, shortcut=False, depth=1)
    bare.load_state_dict(full.state_dict())
    x = probe_input(full, size=6)
    assert count_flops(full, x) == count_flops(bare, x)
    assert not torch.allclose(full(x), bare(x))


def test_probe_outputs_keep_the_input_shape():
    for nets in (shufflenet_v2_probes(g) for g in ("G1", "G2", "G3", "G4")):
        for net in nets.values():
            x = probe_input(net, 2, size=5)
            assert net(x).shape == x.shape


def test_bad_arguments():
    with pytest.raises(ValueError):
        shufflenet_v2_probes("G5")
    with pytest.raises(ValueError):
        shufflenet_v2_probes("G1", 3)
    with pytest.raises(TypeError):
        channel_ratio_net(2.0, 32)
    with pytest.raises(ValueError):
        probe_input(nn.Sequential(nn.ReLU()))


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


def test_hybrid_nets_have_equal_flops_and_run():
    from tricks_lib.design.hybrid_probes import HYBRID_LAYOUTS, hybrid_nets

    torch.manual_seed(0)
    nets = hybrid_nets(32, reference_mid=32, max_mid=128)
    assert list(nets) == list(HYBRID_LAYOUTS)
    x = torch.randn(2, 3, 32, 32)
    flops = [count_flops(net, x) for net in nets.values()]
    assert all(abs(f / flops[0] - 1) <= 0.02 for f in flops), flops
    assert all(net.eval()(x).shape == (2, 10) for net in nets.values())


def test_transformer_block_counts_its_attention():
    from tricks_lib.design.hybrid_probes import _TransformerBlock

    c, mid, n = 32, 64, 16  # 4x4 positions
    block = _TransformerBlock(c, mid, heads=4)
    # qkv + projection (4 N c^2), scores and weighted sum (2 N^2 c), MLP (2 N c mid); 2 FLOPs per multiply-add
    assert count_flops(block, torch.randn(1, c, 4, 4)) == 2 * (4 * n * c * c + 2 * n * n * c + 2 * n * c * mid)


def test_hybrid_net_rejects_bad_layouts():
    from tricks_lib.design.hybrid_probes import hybrid_net

    with pytest.raises(ValueError):
        hybrid_net((("mlp", 1), ("conv", 1)), mid=8)
    with pytest.raises(TypeError):
        hybrid_net(("conv", 1), mid=8)
    with pytest.raises(ValueError):
        hybrid_net((("conv", 1), ("conv", 1)), mid=8, widths=(30, 64))


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
