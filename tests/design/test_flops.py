"""count_flops against analytic counts; the ShuffleNet V2 memory access cost formula; element-wise traffic."""

import pytest
import torch
from known_results import known_comparison
from torch import nn

from tricks_lib.design.flops import (
    conv1x1_memory_access_cost,
    conv_memory_access_cost,
    count_elementwise_access,
    count_flops,
    count_memory_access,
)


def test_conv_flops_are_two_per_multiply_add():
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    x = torch.randn(2, 3, 10, 12)
    # every output element (2 * 8 * 10 * 12) is a dot product of 3 * 3 * 3 weights
    assert count_flops(conv, x) == 2 * (2 * 8 * 10 * 12) * (3 * 3 * 3)


def test_grouped_conv_flops_divide_by_groups():
    conv = nn.Conv2d(8, 16, 1, groups=4, bias=False)
    assert count_flops(conv, torch.randn(1, 8, 5, 5)) == 2 * 25 * 8 * 16 // 4


def test_linear_flops():
    assert count_flops(nn.Linear(7, 5), torch.randn(4, 7)) == 2 * 4 * 7 * 5


def test_multihead_attention_counts_its_projections_and_matmuls():
    # A 1x64x128 block with 4 heads of 32 channels, by hand, in multiply-adds:
    #   q, k, v and output projections: 4 * (64 tokens * 128 * 128)   = 4,194,304
    #   scores q k^T: 4 heads * 64 * 64 * 32                          =   524,288
    #   weighted sum of v: 4 heads * 64 * 64 * 32                     =   524,288
    # total 5,242,880 multiply-adds = 10,485,760 FLOPs (softmax, scaling and biases count 0).
    n, c, heads = 64, 128, 4
    by_hand = 2 * (4 * n * c * c + 2 * heads * n * n * (c // heads))
    assert by_hand == 10_485_760
    attention = nn.MultiheadAttention(c, heads, batch_first=True).eval()  # eval: the fused fast path's mode
    tokens = torch.randn(1, n, c)
    fast_path = torch.backends.mha.get_fastpath_enabled()
    assert count_flops(attention, tokens, tokens, tokens) == by_hand
    assert torch.backends.mha.get_fastpath_enabled() == fast_path and not attention.training

    class SdpaAttention(nn.Module):  # need_weights=False runs scaled_dot_product_attention's fused CPU kernel
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(c, heads, batch_first=True)

        def forward(self, x):
            return self.attention(x, x, x, need_weights=False)[0]

    assert count_flops(SdpaAttention(), tokens) == by_hand
    frozen = nn.MultiheadAttention(c, heads, batch_first=True).requires_grad_(False).eval()
    assert count_flops(frozen, tokens, tokens, tokens) == by_hand  # no parameter needs grad: still decomposed


def test_counting_leaves_batchnorm_statistics_alone():
    net = nn.Sequential(nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4)).train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(3, 2, 5, 5) * 10 + 3
    count_flops(net, x)
    count_memory_access(net, x)
    count_elementwise_access(net, x)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()) and net.training


def test_elementwise_access_counts_reads_and_writes():
    class ReluAdd(nn.Module):
        def forward(self, x):
            return torch.relu(x) + x  # relu: reads n, writes n; add: reads 2n, writes n

    x = torch.randn(2, 3, 4, 5)
    assert count_elementwise_access(ReluAdd(), x) == 5 * x.numel()
    assert count_elementwise_access(nn.ReLU(inplace=True), x.clone()) == 2 * x.numel()  # relu_: read, write
    assert count_elementwise_access(nn.Conv2d(3, 3, 1, bias=False), x) == 0  # counted by count_memory_access
    net = nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.ReLU(), nn.Conv2d(4, 3, 1, bias=False))
    assert count_elementwise_access(net, x) == 2 * (2 * 4 * 4 * 5)  # only the ReLU on (2, 4, 4, 5)


class _Bottleneck(nn.Module):
    """Notebook 04's G4 probe block: 4c -> c (1x1) -> c (3x3) -> 4c (1x1), ReLUs and shortcut switchable."""

    def __init__(self, c, relu, shortcut):
        super().__init__()
        self.reduce = nn.Conv2d(4 * c, c, 1, bias=False)
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.expand = nn.Conv2d(c, 4 * c, 1, bias=False)
        self.relu, self.shortcut = relu, shortcut

    def forward(self, x):
        act = torch.relu if self.relu else (lambda t: t)
        out = self.expand(act(self.conv(act(self.reduce(x)))))
        return act(out + x if self.shortcut else out)


def test_elementwise_access_sees_the_g4_switches_that_flops_cannot():
    c, size = 4, 6
    nets = {(relu, shortcut): _Bottleneck(c, relu, shortcut) for relu in (True, False) for shortcut in (True, False)}
    x = torch.randn(1, 4 * c, size, size)
    traffic = {key: count_elementwise_access(net, x) for key, net in nets.items()}
    hw = size * size
    relu = 2 * (c + c + 4 * c) * hw  # three ReLUs on (c, c, 4c) channels, each read and written once
    shortcut = 3 * 4 * c * hw  # the addition reads two 4c maps and writes one
    assert traffic == {(True, True): relu + shortcut, (True, False): relu, (False, True): shortcut, (False, False): 0}
    assert len({count_flops(net, x) for net in nets.values()}) == 1  # FLOPs cannot tell them apart


def test_count_flops_restores_thread_count():
    threads = torch.get_num_threads()
    count_flops(nn.Linear(3, 3), torch.randn(2, 3))
    count_memory_access(nn.Linear(3, 3), torch.randn(2, 3))
    count_elementwise_access(nn.ReLU(), torch.randn(2, 3))
    assert torch.get_num_threads() == threads


def test_count_flops_restores_training_flag_and_needs_no_grad():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    model.train()
    count_flops(model, torch.randn(2, 4))
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    count_flops(model, torch.randn(2, 4))
    assert not model.training


def test_count_flops_rejects_bad_arguments():
    with pytest.raises(TypeError):
        count_flops("model", torch.randn(1))
    with pytest.raises(ValueError):
        count_flops(nn.Linear(2, 2))
    with pytest.raises(TypeError):
        count_flops(nn.Linear(2, 2), [1.0, 2.0])


def test_mac_formula_values():
    # hw(c1 + c2) + c1 c2 / g
    assert conv1x1_memory_access_cost(32, 32, 56, 56) == 56 * 56 * 64 + 32 * 32
    assert conv1x1_memory_access_cost(64, 128, 7, 7, groups=4) == 49 * 192 + 64 * 128 // 4
    assert conv_memory_access_cost(16, 16, 8, 8, kernel_size=3, groups=16) == 64 * 32 + 9 * 16


def test_mac_is_smallest_at_equal_widths_for_fixed_flops():
    # the paper's Eq. 1: for fixed c1 * c2 the MAC is minimal at c1 == c2
    equal = conv1x1_memory_access_cost(64, 64, 28, 28)
    assert equal < conv1x1_memory_access_cost(32, 128, 28, 28) < conv1x1_memory_access_cost(16, 256, 28, 28)


def test_mac_rejects_bad_sizes():
    with pytest.raises(TypeError):
        conv1x1_memory_access_cost(32.0, 32, 56, 56)
    with pytest.raises(ValueError):
        conv1x1_memory_access_cost(0, 32, 56, 56)
    with pytest.raises(ValueError):
        conv1x1_memory_access_cost(30, 32, 56, 56, groups=4)


def test_count_memory_access_of_a_1x1_conv_matches_the_formula():
    conv = nn.Conv2d(16, 32, 1, groups=2, bias=False)
    assert count_memory_access(conv, torch.randn(1, 16, 7, 9)) == conv1x1_memory_access_cost(16, 32, 7, 9, groups=2)
    net = nn.Sequential(nn.Conv2d(4, 8, 1, bias=False), nn.ReLU(), nn.Conv2d(8, 4, 1, bias=False))
    expected = conv1x1_memory_access_cost(4, 8, 5, 5) + conv1x1_memory_access_cost(8, 4, 5, 5)
    assert count_memory_access(net, torch.randn(1, 4, 5, 5)) == expected  # the ReLU is not counted
    assert not any(m._forward_hooks for m in net.modules())  # hooks removed


def test_rank_by_flops_reads_every_pair_in_flop_order():
    from tricks_lib.design.flops import rank_by_flops

    # FLOPs order a < b < c < d; times: a is slower than b (misranked), c and d tie (unresolved).
    cmp_ = known_comparison({"a": 3e-3, "b": 2e-3, "c": 4e-3, "d": 4.01e-3}, "a")
    flops = {"a": 1, "b": 2, "c": 3, "d": 4}
    ranking = rank_by_flops(cmp_, flops, {"a": 4, "b": 3, "c": 2, "d": 1})
    assert ranking.misranked == (("a", "b"),)
    assert ranking.pairs == 6 and ranking.ranked_right == 4 and ranking.unresolved == 1
    assert [r[0] for r in ranking.rows] == ["a", "b", "c", "d"]
    assert ranking.flops_rho == pytest.approx(0.8) and ranking.mac_rho == pytest.approx(-0.8)
    assert "1 significantly misranked" in ranking.summary and "a slower than b" in ranking._repr_markdown_()
    # FLOP rates: a 1 FLOP / 3 ms, b 2 / 2 ms, c 3 / 4 ms, d 4 / 4.01 ms; slowest a, fastest d
    low, high = ranking.flop_rates
    assert low == pytest.approx(1 / 3e-3, rel=0.01) and high == pytest.approx(4 / 4.01e-3, rel=0.01)
    assert f"{high / low:.1f}x apart" in ranking.summary
    with pytest.raises(KeyError):
        rank_by_flops(cmp_, {"a": 1}, flops)
    with pytest.raises(ValueError):
        rank_by_flops(known_comparison({"a": 1e-3, "b": 2e-3}, "a"), flops, flops)
