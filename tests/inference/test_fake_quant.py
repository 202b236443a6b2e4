"""Fake-quantized weights: the right number of levels, a bounded rounding error, a straight-through gradient."""

import pytest
import torch
from torch import nn

from tricks_lib.inference.fake_quant import fake_quantize, fake_quantize_weights


def _most_levels(model):
    """The most distinct weight values of any output channel of any Linear/Conv2d (as used in forward)."""
    with torch.no_grad():
        return max(
            len(row.unique())
            for m in model.modules()
            if isinstance(m, (nn.Linear, nn.Conv2d))
            for row in m.weight.flatten(1)
        )


@pytest.mark.parametrize(("bits", "levels"), [(1, 2), (2, 3), (4, 15), (8, 255)])
def test_levels_per_channel(bits, levels):
    torch.manual_seed(0)
    model = fake_quantize_weights(nn.Sequential(nn.Linear(600, 4), nn.Conv2d(2, 3, 3)), bits)
    most = _most_levels(model)
    assert most <= levels
    assert most >= min(levels, 3) - 1  # not collapsed to a single value


@pytest.mark.parametrize("bits", [4, 8])
def test_uniform_rounding_error_is_at_most_half_a_step(bits):
    torch.manual_seed(0)
    w = torch.randn(5, 40)
    step = w.abs().amax(1, keepdim=True) / (2 ** (bits - 1) - 1)
    assert ((fake_quantize(w, bits) - w).abs() <= step / 2 + 1e-6).all()


def test_straight_through_gradient_and_input_unchanged():
    w = torch.randn(3, 4, requires_grad=True)
    (fake_quantize(w, 1) * torch.arange(12.0).reshape(3, 4)).sum().backward()
    torch.testing.assert_close(w.grad, torch.arange(12.0).reshape(3, 4))
    model = nn.Linear(4, 2)
    fake_quantize_weights(model, 2)
    assert not hasattr(model, "parametrizations")


def test_8bit_model_output_error_within_bound():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(128, 64)
    with torch.no_grad():
        ref, quant = model(x), fake_quantize_weights(model, 8)(x)
    assert 0 < (quant - ref).abs().max() <= 0.02 * ref.abs().max()


def test_bad_bits_raise():
    with pytest.raises(ValueError):
        fake_quantize_weights(nn.Linear(2, 2), 3)
    with pytest.raises(TypeError):
        fake_quantize(torch.ones(2, 2), 1.0)
    with pytest.raises(ValueError):
        fake_quantize_weights(nn.ReLU(), 8)
