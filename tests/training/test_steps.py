"""Tests for tricks_lib.training.steps: accuracy under inference mode, and the autocast type per device."""

import pytest
import torch
from torch import nn

from tricks_lib.training.steps import autocast_dtype, evaluate_accuracy


def test_evaluate_accuracy_counts_correct_predictions_and_restores_the_mode():
    model = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))  # predicts argmax of the input
    x = torch.eye(3).repeat(4, 1)  # (12, 3)
    y = torch.tensor([0, 1, 2] * 3 + [1, 1, 1])  # the last 3 labels: 1 right, 2 wrong
    model.train()
    assert evaluate_accuracy(model, x, y, batch_size=5) == pytest.approx(10 / 12)
    assert model.training
    with pytest.raises(ValueError):
        evaluate_accuracy(model, x, y[:5])


def test_autocast_dtype_is_bf16_on_a_cpu_and_rejects_a_non_device():
    assert autocast_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError):
        autocast_dtype("not a device")
