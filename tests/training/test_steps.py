"""Tests for tricks_lib.training.steps: accuracy under inference mode, and the autocast type per device."""

import pytest
import torch

from tricks_lib.training.steps import autocast_dtype


def test_autocast_dtype_is_bf16_on_a_cpu_and_rejects_a_non_device():
    assert autocast_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError):
        autocast_dtype("not a device")
