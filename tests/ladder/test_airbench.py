import pytest
import torch

from tricks_lib.ladder.airbench import AIRBENCH94_WIDTHS, init_whitening, make_airbench94
from tricks_lib.training.models import count_parameters


def published_airbench94_count():
    """airbench94.py's make_net(), layer by layer: whitening conv 3->24 (2x2, bias), three ConvGroups
    (conv3x3 c_in->c_out, conv3x3 c_out->c_out, two BatchNorms with weight and bias), Linear 256->10 (no bias)."""
    whiten = 24 * 3 * 2 * 2 + 24
    groups = 0
    for c_in, c_out in ((24, 64), (64, 256), (256, 256)):
        groups += c_in * c_out * 9 + c_out * c_out * 9 + 2 * (c_out + c_out)
    return whiten + groups + 256 * 10


def test_forward_shape_and_intermediate_sizes():
    net = make_airbench94(0.125)
    x = torch.randn(3, 3, 32, 32)
    assert net(x).shape == (3, 10)
    assert net[0](x).shape == (3, 24, 31, 31)  # 2x2 whitening conv, no padding
    h = net[1](net[0](x))
    sizes = []
    for group in list(net)[2:5]:
        h = group(h)
        sizes.append(tuple(h.shape[1:]))
    assert sizes == [(8, 15, 15), (32, 7, 7), (32, 3, 3)]


def test_parameter_count_matches_the_published_definition():
    assert published_airbench94_count() == 1_972_792  # airbench's "1.97M parameters"
    assert count_parameters(make_airbench94(), trainable_only=False) == published_airbench94_count()
    small = make_airbench94(0.25)
    assert small.widths == tuple(w // 4 for w in AIRBENCH94_WIDTHS)
    assert count_parameters(small, trainable_only=False) < published_airbench94_count() / 10


def test_frozen_parameters_follow_the_flags():
    frozen = make_airbench94(0.125)
    assert not frozen.whiten.weight.requires_grad and frozen.whiten.bias.requires_grad
    assert not frozen[2].norm1.weight.requires_grad and frozen[2].norm1.bias.requires_grad
    free = make_airbench94(0.125, frozen_bn_scales=False, frozen_whitening=False)
    assert all(p.requires_grad for p in free.parameters())
    assert count_parameters(free) - count_parameters(frozen) == 24 * 3 * 4 + 2 * (8 + 32 + 32)


def test_output_is_scaled_by_one_ninth():
    net = make_airbench94(0.125).eval()
    x = torch.randn(2, 3, 32, 32)
    unscaled = torch.nn.Sequential(*list(net))(x)
    torch.testing.assert_close(net(x), unscaled / 9)


def test_convs_start_as_identity_on_their_first_channels():
    conv = make_airbench94(0.125)[2].conv1  # 24 -> 8 channels: dirac on 8 filters
    x = torch.randn(1, 24, 9, 9)
    torch.testing.assert_close(conv(x)[:, :8], x[:, :8])


def test_whitening_decorrelates_patches():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(64, 1, 16, 16, generator=g)
    images = torch.cat(
        [base, 0.5 * base + 0.1 * torch.randn(64, 1, 16, 16, generator=g), torch.randn(64, 1, 16, 16, generator=g)], 1
    )
    layer = make_airbench94(0.125).whiten
    init_whitening(layer, images, eps=1e-6)
    with torch.no_grad():
        out = torch.nn.functional.conv2d(images, layer.weight[:12])  # (64, 12, 15, 15) without bias
    flat = out.permute(1, 0, 2, 3).reshape(12, -1)
    covariance = flat @ flat.T / flat.shape[1]
    torch.testing.assert_close(covariance, torch.eye(12), atol=2e-2, rtol=0)
    torch.testing.assert_close(layer.weight[12:], -layer.weight[:12])


def test_bad_arguments():
    with pytest.raises(ValueError):
        make_airbench94(0)
    with pytest.raises(TypeError):
        make_airbench94("wide")
    with pytest.raises(ValueError):
        init_whitening(make_airbench94(0.125).whiten, torch.randn(2, 1, 8, 8))


def test_record_comparison_shows_time_only_for_the_records_task_and_compares_per_flop():
    from tricks_lib.ladder.airbench import TRAINING_FLOPS_PER_FORWARD, PublishedRecord, RecordComparison

    airbench = PublishedRecord("airbench94", seconds=4.0, gpu="A100", train_images=400_000, flops_per_image=200e6,
                               source="a paper, 2024")  # fmt: skip
    myrtle = PublishedRecord("Myrtle.ai", seconds=26.0, gpu="V100", network="ResNet-9")
    assert airbench.images_per_second == 100_000 and myrtle.images_per_second is None
    assert airbench.training_flops_per_second == 100_000 * TRAINING_FLOPS_PER_FORWARD * 200e6
    # 1,000 images/s of a network 20x narrower in FLOPs: 100x the images/s is 2,000x the arithmetic rate
    photos = RecordComparison("a CPU", "photos", 0.125, 0.75, 30.0, 1_000.0, 10e6, (airbench, myrtle), run="top")
    assert not photos.same_task and photos.rows()[0][4] == "-"  # a time to 75% on photos is not a record's time
    assert photos.per_flop(airbench) == pytest.approx(2_000) and photos.per_flop(myrtle) is None
    assert photos.rows()[0][0] == "top" and photos.rows()[1][-1] == "2,000x" and photos.rows()[2][-1] == "-"
    assert photos.rows()[1][2] == "CIFAR-10, width 1" and photos.rows()[2][2] == "CIFAR-10, ResNet-9"
    assert photos.rows()[0][-2] == "30.0 GFLOP/s" and photos.rows()[1][-2] == "60.0 TFLOP/s"
    text = photos._repr_markdown_()
    assert "not a record" in text and "- airbench94: a paper, 2024" in text and "Myrtle.ai:" not in text
    cifar = RecordComparison("an H100", "CIFAR-10", 1.0, 0.94, 3.0, 150_000.0, 200e6, (airbench,))
    assert cifar.same_task and cifar.rows()[0][4] == "3 s" and "not a record" not in repr(cifar)
    with pytest.raises(ValueError):
        RecordComparison("a CPU", "photos", 0.125, 0.75, None, 1_000.0, 0.0, (airbench,))


def test_training_flops_per_image_agree_with_airbench_readme():
    # The README's 0.36 PFLOPs for 9.9 epochs of 50,000 images (0.29 for airbench94_muon's 8 epochs) is about
    # TRAINING_FLOPS_PER_FORWARD forward passes of this network per trained image (evaluation adds a little).
    from tricks_lib.design import count_flops
    from tricks_lib.ladder.airbench import TRAINING_FLOPS_PER_FORWARD

    forward = count_flops(make_airbench94(1.0), torch.zeros(1, 3, 32, 32))
    for pflops, images in ((0.36, 9.9 * 50_000), (0.29, 8 * 50_000)):
        assert 1.0 <= pflops * 1e15 / (images * TRAINING_FLOPS_PER_FORWARD * forward) <= 1.1


def test_record_comparison_gives_the_published_airbench_records_the_counted_flops():
    from tricks_lib.ladder.airbench import PUBLISHED_RECORDS, RecordComparison

    run = RecordComparison("a CPU", "photos", 0.125, 0.75, 30.0, 1_000.0, 10e6, airbench94_flops_per_image=200e6)
    counted = {r.name: r.flops_per_image for r in run.records}
    assert counted == {r.name: None if r.network != "width 1" else 200e6 for r in PUBLISHED_RECORDS}
    assert RecordComparison("a CPU", "photos", 0.125, 0.75, 30.0, 1_000.0, 10e6).records == PUBLISHED_RECORDS
