"""prune_conv_channels: a smaller model that runs, with exactly the parameters the kept channels imply."""

import pytest
import torch
from torch import nn

from tricks_lib.design.pruning import kept_channel_counts, prune_conv_channels
from tricks_lib.training.models import SmallCNN, count_parameters


def _params_of_small_cnn(widths, in_channels, classes):
    """Conv weights (no bias), BatchNorm weight + bias, Linear head, for SmallCNN's four 3x3 convs."""
    total, c_in = 0, in_channels
    for w in widths:
        total += c_in * w * 9 + 2 * w
        c_in = w
    return total + c_in * classes + classes


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_pruned_model_runs_and_loses_the_stated_channels(fraction):
    torch.manual_seed(0)
    model = SmallCNN(10, width=8, in_channels=1)
    pruned = prune_conv_channels(model, fraction)
    widths = kept_channel_counts((8, 16, 32, 32), fraction)
    assert [m.out_channels for m in pruned.modules() if isinstance(m, nn.Conv2d)] == list(widths)
    assert count_parameters(pruned) == _params_of_small_cnn(widths, 1, 10)
    assert count_parameters(model) == _params_of_small_cnn((8, 16, 32, 32), 1, 10)  # the original is untouched
    x = torch.randn(3, 1, 8, 8)
    assert pruned(x).shape == (3, 10)


def test_keeps_the_largest_filters_so_output_matches_when_pruned_channels_are_dead():
    torch.manual_seed(0)
    model = SmallCNN(4, width=4, in_channels=1).eval()
    with torch.no_grad():  # make half of every conv's filters exactly zero: pruning them changes nothing
        for conv in (m for m in model.modules() if isinstance(m, nn.Conv2d)):
            conv.weight[conv.out_channels // 2 :] = 0
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.bias[bn.num_features // 2 :] = 0  # and their BatchNorm shifts, so the dead channels stay zero
    pruned = prune_conv_channels(model, 0.5).eval()
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(pruned(x), model(x))


def test_fraction_zero_is_a_copy_and_bad_fractions_raise():
    model = SmallCNN(10, width=4, in_channels=1).eval()
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(prune_conv_channels(model, 0)(x), model(x))
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError):
            prune_conv_channels(model, bad)
    with pytest.raises(TypeError):
        prune_conv_channels(model, "half")
    with pytest.raises(ValueError):
        prune_conv_channels(nn.Sequential(nn.Linear(2, 2)), 0.5)
