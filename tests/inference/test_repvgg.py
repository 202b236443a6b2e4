"""RepVGGBlock: the deploy form (one 3x3 conv + ReLU) equals the three-branch block in eval mode."""

import pytest
import torch
from torch import nn

from tricks_lib.inference.repvgg import RepVGGBlock


@pytest.mark.parametrize(("c_in", "c_out", "stride"), [(4, 4, 1), (4, 6, 1), (4, 4, 2)])
def test_deploy_form_equals_block(c_in, c_out, stride, randomize_batchnorm):
    torch.manual_seed(0)
    block = RepVGGBlock(c_in, c_out, stride=stride)
    randomize_batchnorm(block)
    block.eval()
    assert (block.identity is not None) == (c_in == c_out and stride == 1)
    deploy = block.reparameterize()
    x = torch.randn(2, c_in, 9, 9)
    torch.testing.assert_close(deploy(x), block(x), atol=1e-5, rtol=1e-4)
    convs = [m for m in deploy.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 1 and convs[0].kernel_size == (3, 3)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in deploy.modules())


def test_identity_branch_changes_the_output(randomize_batchnorm):
    # The identity BN must be counted: zeroing it must change the block's output.
    torch.manual_seed(0)
    block = RepVGGBlock(3, 3)
    randomize_batchnorm(block)
    block.eval()
    x = torch.randn(1, 3, 5, 5)
    before = block(x)
    block.identity.weight.data.zero_()
    block.identity.bias.data.zero_()
    assert not torch.allclose(before, block(x))


def test_training_mode_and_bad_arguments_raise():
    block = RepVGGBlock(2, 2)
    with pytest.raises(ValueError, match="eval"):
        block.reparameterize()
    with pytest.raises(ValueError, match="stride"):
        RepVGGBlock(2, 2, stride=3)
    with pytest.raises((TypeError, ValueError)):
        RepVGGBlock(0, 2)
