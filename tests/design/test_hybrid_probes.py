"""TRT-ViT-style hybrid networks: equal FLOPs, attention counted, layouts validated."""

import pytest
import torch

from tricks_lib.design.flops import count_flops


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
