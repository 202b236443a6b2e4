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


class ChangesUnderChannelsLast(nn.Module):
    """A model that computes something else for an NHWC input (as a layout-dependent custom op might)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 4)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return self.head(y * 1.5 if x.is_contiguous(memory_format=torch.channels_last) else y)


def test_a_trick_that_fails_its_check_is_never_recommended_and_says_by_how_much():
    report = try_training_tricks(
        ChangesUnderChannelsLast,
        batch,
        F.cross_entropy,
        device="cpu",
        tricks=["channels_last"],
        budget_s=10,
        memory_budget_bytes=1 << 40,  # would recommend a trick that passed and saved memory
    )
    row = rows_of(report)["channels_last"]
    assert (
        not row.check_passed and row.check.startswith("failed: largest relative error") and "bound 1e-02" in row.check
    )
    assert max(dict(row.errors).values()) > 1e-3 and row.speedup is None  # never timed
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
    from tricks_lib.env import describe

    if not describe().cpu_bf16_native:
        pytest.skip("needs a CPU with native bf16: the memory-saving trick this test stacks")
    report = try_training_tricks(
        small_cnn,
        batch,
        F.cross_entropy,
        device="cpu",
        tricks=["bf16 autocast", "foreach optimizer"],
        budget_s=15,
        memory_budget_bytes=1 << 40,  # saves memory against the baseline and fits: recommended whatever its speed
    )
    rows = rows_of(report)
    assert rows["bf16 autocast"].saved_bytes < report.baseline_saved_bytes  # 16-bit activations
    assert "bf16 autocast" in [r.name for r in report.recommended]
    assert report.stacked is not None and report.stacked.names == ("baseline", "stacked")
    assert report.stacked_check.startswith("passed") and "bound 1e-01" in report.stacked_check  # a lossy trick's bound
    assert "torch.bfloat16" in report.code()


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
        ({"budget_s": 0}, ValueError, "budget_s must be a positive, finite number"),
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


def test_tricks_that_replace_each_other_are_never_recommended_together():
    from tricks_lib.advise import AdviceReport, TrickRow
    from tricks_lib.outcome import Outcome

    def row(name, speedup):
        return TrickRow(
            name,
            applies=True,
            check="passed",
            check_passed=True,
            outcome=Outcome.FASTER,
            speedup=speedup,
            lines=f"# {name}",
        )

    rows = (row("foreach optimizer", 1.2), row("fused optimizer", 1.5), row("channels_last", 1.1))
    report = AdviceReport("training", "cpu", rows, None, None, "-", 10.0, 1.0)
    assert [r.name for r in report.recommended] == ["fused optimizer", "channels_last"]
    assert "# foreach optimizer" not in report.code() and "# fused optimizer" in report.code()


def test_the_timing_plan_fits_the_budget_and_keeps_a_share_for_the_stack():
    from tricks_lib.advise.timing import CALLS_PER_VARIANT, plan_timing

    chosen, per_variant = plan_timing(["a", "b", "c"], call_seconds=1.0, seconds_left=40.0)
    assert chosen == ["a"]  # 0.75 * 40 s buys 2 variants of 11 one-second calls: the baseline and one trick
    assert (len(chosen) + 1) * CALLS_PER_VARIANT <= 0.75 * 40 and per_variant >= 0.05
    assert plan_timing(["a"], call_seconds=5.0, seconds_left=20.0)[0] == []  # one step too slow: nothing timed


def test_a_non_finite_budget_and_a_budget_of_the_wrong_type_are_refused():
    with pytest.raises(ValueError, match="finite"):
        try_training_tricks(small_cnn, batch, F.cross_entropy, device="cpu", budget_s=float("inf"))
    with pytest.raises(TypeError, match="budget_s must be a number"):
        try_training_tricks(small_cnn, batch, F.cross_entropy, device="cpu", budget_s="60")


def test_targets_keep_their_structure_and_outputs_of_any_structure_are_checked_whole():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 2)

        def forward(self, x):
            return {"a": self.a(x), "b": self.b(x)}

    def loss(out, targets):
        ya, yb = targets  # a tuple of targets arrives as a tuple
        return F.cross_entropy(out["a"], ya) + F.cross_entropy(out["b"], yb)

    def two_targets():
        return torch.randn(8, 6), (torch.randint(0, 3, (8,)), torch.randint(0, 2, (8,)))

    training = try_training_tricks(TwoHeads, two_targets, loss, device="cpu", tricks=["foreach optimizer"], budget_s=8)
    assert rows_of(training)["foreach optimizer"].check_passed
    inference = try_inference_tricks(TwoHeads, lambda: torch.randn(8, 6), device="cpu", tricks=["no_grad"], budget_s=5)
    assert rows_of(inference)["no_grad"].check.startswith("passed: relative output error 0.0e+00")


def test_batch_sizes_time_the_baseline_by_throughput_and_need_a_batch_size_argument():
    def make_batch(batch_size=8):
        g = torch.Generator().manual_seed(0)
        return torch.randn(batch_size, 3, 16, 16, generator=g), torch.randint(0, 4, (batch_size,), generator=g)

    report = try_training_tricks(
        small_cnn,
        make_batch,
        F.cross_entropy,
        device="cpu",
        tricks=["foreach optimizer"],
        budget_s=30,
        batch_sizes=[4, 16],
        progress=False,
    )
    assert report.batch_sizes.names == ("batch 4", "batch 16")
    assert report.batch_sizes["batch 16"].measurement.items == 16  # compared by samples per second
    assert "Batch sizes, baseline step by throughput: batch 4:" in str(report)
    with pytest.raises(TypeError, match="make_batch must take batch_size="):
        try_training_tricks(small_cnn, batch, F.cross_entropy, device="cpu", tricks=[], budget_s=30, batch_sizes=[4])
    with pytest.raises(ValueError, match="batch_sizes"):
        try_training_tricks(small_cnn, make_batch, F.cross_entropy, device="cpu", budget_s=5, batch_sizes=[4, 0])
    with pytest.raises(TypeError, match="progress"):
        try_training_tricks(small_cnn, make_batch, F.cross_entropy, device="cpu", budget_s=5, progress="yes")


def one_linear():
    """One layer: the fewest kernels for the fresh processes of a compile's first call to build."""
    torch.manual_seed(0)
    return nn.Linear(16, 4)


@pytest.mark.slow
def test_the_compiled_forward_pays_its_first_call_in_fresh_processes_and_says_when_it_pays_back():
    report = try_inference_tricks(
        one_linear,
        lambda: torch.randn(64, 16, generator=torch.Generator().manual_seed(0)),
        device="cpu",
        tricks=["torch.compile"],
        budget_s=45,
        progress=False,
    )
    row = rows_of(report)["torch.compile"]
    assert row.check_passed, row.check
    assert row.note.startswith("first call in a fresh process") and "(empty caches)" in row.note
    assert "pays" in row.note  # the break-even: after how many calls, or never here


@pytest.mark.slow
def test_the_compiled_training_step_pays_its_first_step_in_fresh_processes_model_and_loss_exported_together():
    report = try_training_tricks(
        one_linear,
        lambda: (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), torch.randint(0, 4, (8,))),
        F.cross_entropy,
        device="cpu",
        tricks=["torch.compile"],
        budget_s=45,
        progress=False,
    )
    row = rows_of(report)["torch.compile"]
    assert row.check_passed, row.check
    assert row.note.startswith("first step in a fresh process") and "(warm cache)" in row.note, row.note
    assert "pays off" in row.note  # after how many steps, or never here


def test_a_model_torch_export_cannot_take_is_compiled_here_and_the_row_says_why(monkeypatch):
    import tricks_lib.advise.compile_first as compile_first

    def refuse(*args, **kwargs):
        raise RuntimeError("data-dependent control flow\nmore detail")

    monkeypatch.setattr(compile_first, "export_for_fresh_processes", refuse)
    cost, why = compile_first.fresh_process_compile_cost(small_cnn(), (batch()[0],), "compiled(*inputs)", "cpu", False)
    assert cost is None and why == "data-dependent control flow"
    note = compile_first.first_call_note(None, 2.5, "step", why)
    assert (
        note
        == "first step 2.5 s in this process, cold cache (torch.export could not export it: data-dependent control flow)"
    )


def test_the_loss_module_computes_the_loss_of_the_models_output_on_the_last_argument_as_targets():
    from tricks_lib.advise.compile_first import LossOf

    x, y = batch()
    model = small_cnn()
    assert torch.equal(LossOf(model, F.cross_entropy)(x, y), F.cross_entropy(model(x), y))


def test_fewer_threads_runs_the_call_on_half_the_threads_and_restores_the_count():
    threads = torch.get_num_threads()
    report = try_inference_tricks(
        small_cnn, lambda: batch()[0], device="cpu", tricks=["fewer threads"], budget_s=20, progress=False
    )
    row = rows_of(report)["fewer threads"]
    assert torch.get_num_threads() == threads  # the caller's setting is left as it was
    if threads == 1:
        assert not row.applies and "one thread" in row.reason
    else:
        assert row.check_passed and row.note == f"{threads // 2} of {threads} threads"
        assert row.lines == f"torch.set_num_threads({threads // 2})" and row.speedup is not None
