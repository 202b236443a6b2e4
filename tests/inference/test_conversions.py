"""reparameterize and output_error: equal outputs in eval mode, no BatchNorm left; a lossy variant's error."""

import io
import warnings

import pytest
import torch
from torch import nn

from tricks_lib.inference.conversions import output_error, reparameterize
from tricks_lib.inference.repvgg import RepVGGBlock


def _count(model, kind):
    return sum(isinstance(m, kind) for m in model.modules())


def test_reparameterize_converts_every_block(randomize_batchnorm):
    torch.manual_seed(0)
    model = nn.Sequential(RepVGGBlock(3, 8, stride=2), RepVGGBlock(8, 8), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))  # materialize the lazy layer
    randomize_batchnorm(model)
    model.eval()
    deploy = reparameterize(model)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(deploy(x), model(x), atol=1e-4, rtol=1e-4)
    assert _count(deploy, RepVGGBlock) == 0 and _count(deploy, nn.BatchNorm2d) == 0
    assert _count(model, RepVGGBlock) == 2
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
    sizes = [io.BytesIO() for _ in range(2)]
    torch.save(quantized.state_dict(), sizes[0])
    torch.save(model.state_dict(), sizes[1])
    assert sizes[0].tell() < sizes[1].tell()  # int8 weights are smaller on disk


def test_output_error_reads_shapes_and_agreement():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    err = output_error(ref, torch.tensor([[1.0, 0.5], [0.0, 0.9]]))
    assert err.max_abs_error == pytest.approx(0.5) and err.top1_agreement == 1.0
    assert output_error(ref, torch.tensor([[0.0, 1.0], [0.0, 1.0]])).top1_agreement == 0.5
    with pytest.raises(ValueError):
        output_error(ref, ref[:1])


def test_output_error_compares_outputs_of_any_shape():
    images = torch.zeros(2, 3, 4, 4)
    moved = images.clone()
    moved[1, 2, 3, 3] = 0.25
    err = output_error(images + 1, moved + 1, label="decoder")
    assert err.samples == 2 and err.max_abs_error == pytest.approx(0.25) and err.top1_agreement is None
    assert err.max_relative_error == pytest.approx(0.25) and "top-1" not in repr(err)
    values = output_error(torch.tensor([1.0, -2.0, 4.0]), torch.tensor([1.0, -2.0, 3.0]))  # a regression's (N,)
    assert values.max_abs_error == 1.0 and values.mean_abs_error == pytest.approx(1 / 3) and values.samples == 3
    assert output_error(torch.tensor(2.0), torch.tensor(2.5)).samples == 1  # a scalar (a loss)
    with pytest.raises(ValueError, match="same, non-empty shape"):
        output_error(torch.zeros(0, 3), torch.zeros(0, 3))
    with pytest.raises(TypeError, match="complex"):
        output_error(torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.complex64))
