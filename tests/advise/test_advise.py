"""tricks_lib.advise: every applicable trick tried on the reader's model, checked against the baseline, then timed."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tricks_lib.__main__ import main
from tricks_lib.advise import TRAINING_TRICKS, try_inference_tricks, try_training_tricks

NO_COMPILE = [t for t in TRAINING_TRICKS if t != "torch.compile"]


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


class FlattensWithView(nn.Module):
    """x.view() needs a contiguous NCHW tensor: under channels_last it raises, as in many real models."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 16 * 16, 4)

    def forward(self, x):
        y = self.conv(x)
        return self.head(y.view(y.shape[0], -1))


def rows_of(report):
    return {r.name: r for r in report.rows}


def test_each_trick_applies_or_says_why_and_every_one_that_ran_was_checked_then_timed():
    report = try_training_tricks(small_cnn, batch, F.cross_entropy, device="cpu", tricks=NO_COMPILE, budget_s=20)
    rows = rows_of(report)
    assert list(rows) == NO_COMPILE
    assert not rows["fp16 autocast + GradScaler"].applies and "CUDA" in rows["fp16 autocast + GradScaler"].reason
    assert not rows["TF32 matmuls"].applies and not rows["cudnn.benchmark"].applies
    assert "default since torch 2.0" in rows["zero_grad(set_to_none=True)"].reason
    cl = rows["channels_last"]
    assert cl.applies and cl.check_passed and cl.check.startswith("passed") and cl.speedup is not None
    assert cl.outcome is not None and cl.speedup_low <= cl.speedup_high and cl.saved_bytes > 0
    assert rows["foreach optimizer"].check.startswith("passed: largest relative error 0.0e+00")  # same maths exactly
    assert report.comparison is not None and "baseline" in report.comparison.names
    assert 0 < report.seconds_used and "Training tricks on cpu" in str(report) and "<table>" in report._repr_html_()


def test_channels_last_does_not_apply_without_convolutions():
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 4))

    report = try_training_tricks(mlp, batch, F.cross_entropy, device="cpu", tricks=["channels_last"], budget_s=5)
    assert rows_of(report)["channels_last"].reason == "no 2-D convolution in the model"


def test_a_trick_that_fails_its_check_is_never_recommended_and_says_by_how_much():
    report = try_training_tricks(
        small_cnn,
        batch,
        F.cross_entropy,
        device="cpu",
        tricks=["channels_last"],
        budget_s=10,
        exact_tolerance=1e-12,
        memory_budget_bytes=1 << 40,  # would recommend anything that passed
    )
    row = rows_of(report)["channels_last"]
    assert (
        not row.check_passed and row.check.startswith("failed: largest relative error") and "bound 1e-12" in row.check
    )
    assert report.recommended == () and report.stacked is None and "nothing to add" in report.code()


def test_a_trick_that_raises_is_a_row_with_its_error_not_the_reports_end():
    report = try_training_tricks(
        FlattensWithView,
        batch,
        F.cross_entropy,
        device="cpu",
        tricks=["channels_last", "foreach optimizer"],
        budget_s=10,
    )
    rows = rows_of(report)
    assert rows["channels_last"].check.startswith("raised RuntimeError: view size is not compatible")
    assert rows["foreach optimizer"].check_passed  # the other tricks still ran


def test_the_recommended_tricks_are_stacked_checked_and_measured_and_their_lines_given():
    report = try_training_tricks(
        small_cnn,
        batch,
        F.cross_entropy,
        device="cpu",
        tricks=["channels_last", "foreach optimizer"],
        budget_s=15,
        memory_budget_bytes=1 << 40,  # every trick that passed fits: recommended whatever its speed
    )
    assert [r.name for r in report.recommended] == ["channels_last", "foreach optimizer"]
    assert report.stacked is not None and report.stacked.names == ("baseline", "stacked")
    assert report.stacked_check.startswith("passed")
    code = report.code()
    assert (
        "torch.channels_last" in code and "foreach=True" in code and code.index("channels_last") < code.index("foreach")
    )


def test_inference_tricks_are_checked_on_outputs_with_the_lossy_ones_against_their_own_bound():
    report = try_inference_tricks(
        small_cnn,
        lambda: batch()[0],
        device="cpu",
        budget_s=15,
        tricks=["no_grad", "inference_mode", "bf16 autocast", "dynamic int8 (Linear)", "fp16 autocast"],
    )
    rows = rows_of(report)
    assert rows["no_grad"].check.startswith(
        "passed: relative output error 0.0e+00 (bound 1e-03), same argmax for 100.0%"
    )
    assert "bound 5e-02" in rows["dynamic int8 (Linear)"].check
    assert not rows["fp16 autocast"].applies
    assert all(r.speedup is not None for r in report.rows if r.check_passed)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"make_model": "resnet"}, TypeError, "make_model must be a function"),
        (
            {"make_batch": lambda: ([1, 2], torch.zeros(2))},
            TypeError,
            r"make_batch\(\)\[0\] \(the inputs\) must be a tensor",
        ),
        ({"make_batch": lambda: torch.zeros(2)}, TypeError, r"make_batch must return \(inputs, targets\)"),
        (
            {"loss_fn": lambda out, y: F.cross_entropy(out, y, reduction="none")},
            ValueError,
            "loss_fn must return a scalar",
        ),
        ({"tricks": ["channel_last"]}, ValueError, r"unknown trick\(s\) \['channel_last'\]"),
        ({"budget_s": 0}, ValueError, "budget_s must be a positive number"),
        ({"exact_tolerance": -1}, ValueError, "exact_tolerance must be a positive"),
    ],
)
def test_bad_input_gets_a_clear_error_naming_the_argument(kwargs, error, match):
    args = {"make_model": small_cnn, "make_batch": batch, "loss_fn": F.cross_entropy, "device": "cpu", "budget_s": 5}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        try_training_tricks(args.pop("make_model"), args.pop("make_batch"), args.pop("loss_fn"), **args)


def test_a_model_whose_weights_change_between_calls_is_refused():
    with pytest.raises(ValueError, match="make_model returned different weights on two calls"):
        try_training_tricks(
            lambda: nn.Linear(3, 2),
            lambda: (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)),
            F.cross_entropy,
            device="cpu",
            budget_s=5,
        )


def test_the_command_reads_the_factories_from_a_module_file(tmp_path, capsys):
    module = tmp_path / "my_bench.py"
    module.write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "def make_model():\n    torch.manual_seed(0)\n    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))\n"
        "def make_batch():\n    return torch.randn(16, 6), torch.randint(0, 3, (16,))\n"
        "make_input = lambda: torch.randn(16, 6)\n"
        "loss_fn = F.cross_entropy\n"
    )
    assert main(["advise", str(module), "--device", "cpu", "--budget", "8", "--tricks", "foreach optimizer"]) == 0
    out = capsys.readouterr().out
    assert "| foreach optimizer | yes | passed" in out and "Lines to add:" in out
    assert main(["advise", str(module), "--inference", "--device", "cpu", "--budget", "5", "--tricks", "no_grad"]) == 0
    assert main(["advise", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
