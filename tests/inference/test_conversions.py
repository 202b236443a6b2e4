"""fuse_conv_bn and reparameterize: equal outputs in eval mode, no BatchNorm left, input left unchanged."""

import warnings

import pytest
import torch
from torch import nn

from tricks_lib.inference.conversions import (
    count_modules,
    fuse_conv_bn,
    output_error,
    reparameterize,
    serialized_size,
)
from tricks_lib.inference.repvgg import RepVGGBlock


class _Residual(nn.Module):
    """conv/bn held as attributes (not in a Sequential) plus a skip: needs the FX graph to find them."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return self.head(y + self.bn2(self.conv2(y)))


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: FX cannot trace this
            return self.body(x)
        return self.body(-x)


@pytest.mark.parametrize("make", [_Residual, _Untraceable])
def test_fusion_is_equivalent_and_leaves_no_batchnorm(make, randomize_batchnorm):
    torch.manual_seed(0)
    model = make()
    randomize_batchnorm(model)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused = fuse_conv_bn(model)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(fused(x), model(x), atol=1e-5, rtol=1e-4)
    assert count_modules(fused, nn.BatchNorm2d) == 0
    assert count_modules(model, nn.BatchNorm2d) > 0 and not fused.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the input model changed"


def test_fusion_keeps_a_conv_whose_output_is_used_twice(randomize_batchnorm):
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    torch.manual_seed(0)
    model = Both()
    randomize_batchnorm(model)
    model.eval()
    fused = fuse_conv_bn(model)
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(fused(x), model(x))
    assert count_modules(fused, nn.BatchNorm2d) == 1


def test_fusion_rejects_training_mode_and_non_modules():
    with pytest.raises(ValueError, match="eval"):
        fuse_conv_bn(nn.Sequential(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1)))
    with pytest.raises(TypeError):
        fuse_conv_bn("model")


def test_reparameterize_converts_every_block(randomize_batchnorm):
    torch.manual_seed(0)
    model = nn.Sequential(RepVGGBlock(3, 8, stride=2), RepVGGBlock(8, 8), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))  # materialize the lazy layer
    randomize_batchnorm(model)
    model.eval()
    deploy = reparameterize(model)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(deploy(x), model(x), atol=1e-4, rtol=1e-4)
    assert count_modules(deploy, RepVGGBlock) == 0 and count_modules(deploy, nn.BatchNorm2d) == 0
    assert count_modules(model, RepVGGBlock) == 2
    with pytest.raises(ValueError):
        reparameterize(model.train())


def test_dynamic_int8_error_is_within_bound():
    # Dynamic int8 of Linear layers: per-tensor int8 activations and weights. Bound: 5% of the logit range.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    x = torch.randn(256, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    err = output_error(model(x), quantized(x), label="int8")
    assert 0 < err.max_abs_error <= 0.05 * err.reference_scale
    assert err.top1_agreement >= 0.9
    assert serialized_size(quantized) < serialized_size(model)


def test_output_error_reads_shapes_and_agreement():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    err = output_error(ref, torch.tensor([[1.0, 0.5], [0.0, 0.9]]))
    assert err.max_abs_error == pytest.approx(0.5) and err.top1_agreement == 1.0
    assert output_error(ref, torch.tensor([[0.0, 1.0], [0.0, 1.0]])).top1_agreement == 0.5
    with pytest.raises(ValueError):
        output_error(ref, ref[:1])
