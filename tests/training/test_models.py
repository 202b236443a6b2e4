"""Tests for tricks_lib.training.models: output shapes, argument checks, and the conv-bias-before-BN removal."""

import pytest
import torch
from torch import nn

from tricks_lib.training.models import MLP, ResNet, SmallCNN, count_parameters, drop_conv_bias_before_bn


@pytest.mark.parametrize(
    "model",
    [
        SmallCNN(10, width=8),
        SmallCNN(7, width=4, batch_norm=False),
        ResNet(10, widths=(8, 16, 32)),
        ResNet(5, widths=(4, 8, 8), blocks_per_stage=2),
    ],
    ids=["cnn", "cnn-nobn", "resnet", "resnet-2blocks"],
)
def test_image_models_map_32x32_images_to_logits(model):
    out = model(torch.randn(3, 3, 32, 32))
    assert out.shape == (3, model.head.out_features)
    assert torch.isfinite(out).all()


def test_resnet_stages_downsample_by_four():
    model = ResNet(10, widths=(4, 8, 16))
    x = model.stages(model.stem(torch.randn(2, 3, 32, 32)))
    assert x.shape == (2, 16, 8, 8)


def test_mlp_flattens_and_has_the_requested_depth():
    model = MLP(8 * 8, 10, hidden=32, depth=3)
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 4
    assert count_parameters(MLP(4, 2, depth=0)) == 4 * 2 + 2


def test_small_cnn_conv_bias_switch_changes_only_the_biases():
    with_bias, without = SmallCNN(10, width=8, conv_bias=True), SmallCNN(10, width=8)
    convs = [m for m in with_bias.modules() if isinstance(m, nn.Conv2d)]
    assert count_parameters(with_bias) - count_parameters(without) == sum(c.out_channels for c in convs)
    # without BatchNorm the bias is not redundant, so it is kept whatever conv_bias says
    assert all(m.bias is not None for m in SmallCNN(width=4, batch_norm=False).modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize(
    "build, error",
    [
        (lambda: SmallCNN(0), ValueError),
        (lambda: SmallCNN(10, width=2.5), TypeError),
        (lambda: ResNet(10, widths=(8, 16)), ValueError),
        (lambda: MLP(4, 2, depth=-1), ValueError),
        (lambda: drop_conv_bias_before_bn("not a model"), TypeError),
        (lambda: count_parameters(None), TypeError),
    ],
)
def test_bad_arguments_raise(build, error):
    with pytest.raises(error):
        build()


def _trained_cnn_with_bias() -> SmallCNN:
    """A SmallCNN whose conv biases and BN running stats are far from their initial values."""
    torch.manual_seed(0)
    model = SmallCNN(10, width=8, conv_bias=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.bias.uniform_(-1.0, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(torch.randn(16, 3, 32, 32) + 0.5), torch.randint(0, 10, (16,)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def test_dropping_conv_bias_before_bn_keeps_eval_outputs():
    model = _trained_cnn_with_bias()
    slim = drop_conv_bias_before_bn(model).eval()
    convs = [m for m in slim.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.bias is None for c in convs)
    assert count_parameters(model) - count_parameters(slim) == sum(c.out_channels for c in convs)
    assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Conv2d)), "original unchanged"
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        # identical up to float32 rounding: (x + b) - mean vs x - (mean - b)
        torch.testing.assert_close(slim(x), model(x), rtol=1e-5, atol=1e-5)


def test_dropping_conv_bias_before_bn_keeps_train_mode_outputs():
    # In training mode BN subtracts the batch mean, which removes a per-channel constant exactly.
    model = _trained_cnn_with_bias().train()
    slim = drop_conv_bias_before_bn(model).train()
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(slim(x), model(x), rtol=1e-4, atol=1e-4)


def test_dropping_conv_bias_leaves_convs_without_bn_alone():
    model = SmallCNN(10, width=4, batch_norm=False)
    slim = drop_conv_bias_before_bn(model)
    assert count_parameters(slim) == count_parameters(model)
