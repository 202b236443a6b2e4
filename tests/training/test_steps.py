"""Tests for tricks_lib.training.steps: gradient accumulation, autocast, channels_last, zero_grad, compile, schedules."""

import math

import pytest
import torch
from torch import nn

from tricks_lib.training.models import MLP, SmallCNN
from tricks_lib.training.steps import (
    evaluate_accuracy,
    linear_scaled_lr,
    linear_warmup,
    make_train_step,
    warmup_factor,
)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("batch, k", [(32, 4), (10, 3)], ids=["even split", "uneven split"])
def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch(batch, k):
    # No BatchNorm: BN normalizes by micro-batch statistics, which would make the two differ.
    torch.manual_seed(0)
    model = SmallCNN(10, width=4, batch_norm=False)
    x, y = torch.randn(batch, 3, 16, 16), torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    one = make_train_step(model, opt, accumulation_steps=1)
    loss_one = one.backward(x, y)
    full = _grads(model)
    opt.zero_grad(set_to_none=True)
    acc = make_train_step(model, opt, accumulation_steps=k)
    loss_acc = acc.backward(x, y)
    # Same maths, different summation order: float32 agreement to ~1e-6 relative.
    torch.testing.assert_close(loss_acc, loss_one, rtol=1e-5, atol=1e-6)
    for g_acc, g_full in zip(_grads(model), full):
        torch.testing.assert_close(g_acc, g_full, rtol=1e-4, atol=1e-6)


def test_accumulation_rejects_a_batch_smaller_than_the_number_of_micro_batches():
    model = MLP(4, 2, hidden=4)
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=4)
    with pytest.raises(ValueError, match="micro-batches"):
        step(torch.randn(3, 4), torch.randint(0, 2, (3,)))


def test_bf16_autocast_step_runs_on_cpu_in_bf16():
    torch.manual_seed(0)
    model = SmallCNN(10, width=4)
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    model.head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), autocast_dtype=torch.bfloat16)
    assert not step.config.grad_scaling, "bf16 needs no loss scaling"
    loss = step(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    assert seen == [torch.bfloat16], "the linear layer ran under bf16 autocast"
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights stay fp32"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "the optimizer stepped"


def test_fp16_autocast_uses_a_grad_scaler():
    model = MLP(8, 3, hidden=8)
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), autocast_dtype=torch.float16)
    assert step.config.grad_scaling and step.scaler.is_enabled()
    assert torch.isfinite(step(torch.randn(4, 8), torch.randint(0, 3, (4,))))


def test_fp16_step_on_cpu_skips_an_overflowing_step_and_lowers_the_scale():
    # A loss so large that its scaled gradient overflows fp16: GradScaler finds inf in the
    # unscaled gradients, skips optimizer.step() and halves its scale.
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=8)
    before = [p.detach().clone() for p in model.parameters()]
    step = make_train_step(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), autocast_dtype=torch.float16,
        loss_fn=lambda out, y: nn.functional.cross_entropy(out, y) * 1e9,
    )  # fmt: skip
    scale = step.scaler.get_scale()
    step(torch.randn(4, 8), torch.randint(0, 3, (4,)))
    assert step.scaler.get_scale() == scale * 0.5
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "the step was skipped"


def test_no_sync_switch_is_recorded_and_ignored_without_ddp():
    # Without DDP there is no all-reduce to skip: both settings give the same gradients.
    torch.manual_seed(0)
    model = SmallCNN(10, width=4, batch_norm=False)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = {}
    for flag in (True, False):
        step = make_train_step(model, opt, accumulation_steps=2, no_sync=flag)
        assert step.config.no_sync is flag and ("no_sync=False" in repr(step.config)) is not flag
        step.backward(x, y)
        grads[flag] = _grads(model)
        opt.zero_grad(set_to_none=True)
    for a, b in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_channels_last_step_matches_the_default_layout():
    torch.manual_seed(0)
    ref = SmallCNN(10, width=4)
    cl = SmallCNN(10, width=4)
    cl.load_state_dict(ref.state_dict())
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    step_ref = make_train_step(ref, torch.optim.SGD(ref.parameters(), lr=0.1))
    step_cl = make_train_step(cl, torch.optim.SGD(cl.parameters(), lr=0.1), channels_last=True)
    assert cl.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(step_cl(x, y), step_ref(x, y), rtol=1e-5, atol=1e-5)
    for a, b in zip(cl.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_set_to_none_decides_what_the_gradients_are_after_a_step(set_to_none):
    model = MLP(4, 2, hidden=4)
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), set_to_none=set_to_none)
    step(torch.randn(4, 4), torch.randint(0, 2, (4,)))
    grads = [p.grad for p in model.parameters()]
    if set_to_none:
        assert all(g is None for g in grads)
    else:
        assert all(g is not None and not g.any() for g in grads)


def test_compiled_step_matches_eager():
    # backend="eager" traces with dynamo but generates no kernels: seconds instead of a minute.
    torch.manual_seed(0)
    eager, compiled = MLP(6, 3, hidden=8), MLP(6, 3, hidden=8)
    compiled.load_state_dict(eager.state_dict())
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    s_eager = make_train_step(eager, torch.optim.SGD(eager.parameters(), lr=0.1))
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    s_comp = make_train_step(compiled, opt, compile=True, compile_backend="eager")
    for _ in range(2):
        torch.testing.assert_close(s_comp(x, y), s_eager(x, y))
    for a, b in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(autocast_dtype=torch.float64), ValueError),
        (dict(accumulation_steps=0), ValueError),
        (dict(accumulation_steps=2.0), ValueError),
    ],
)
def test_make_train_step_rejects_bad_switches(kwargs, error):
    model = MLP(4, 2)
    with pytest.raises(error):
        make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_make_train_step_rejects_wrong_types():
    model = MLP(4, 2)
    with pytest.raises(TypeError):
        make_train_step("model", torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError):
        make_train_step(model, "sgd")
    with pytest.raises(TypeError, match="no_sync"):
        make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), no_sync=1)


def test_warmup_factor_values_are_exact():
    # start + (1 - start) * step / warmup with binary-exact numbers: compare with ==, not approx.
    got = [warmup_factor(s, warmup_steps=3, start_factor=0.25) for s in range(6)]
    assert got == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [warmup_factor(s, warmup_steps=4, start_factor=0.0) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert warmup_factor(0, warmup_steps=0) == 1.0


def test_cosine_decay_after_warmup_ends_at_min_factor():
    kw = dict(warmup_steps=2, start_factor=0.5, total_steps=6, decay="cosine", min_factor=0.1)
    assert warmup_factor(2, **kw) == 1.0
    assert warmup_factor(4, **kw) == pytest.approx(0.55, abs=1e-12)  # halfway: (1 + min) / 2
    assert warmup_factor(6, **kw) == pytest.approx(0.1, abs=1e-12)
    assert warmup_factor(60, **kw) == pytest.approx(0.1, abs=1e-12)


def test_linear_warmup_scheduler_sets_exact_learning_rates():
    model = MLP(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = linear_warmup(opt, warmup_steps=4, start_factor=0.25)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.125, 0.21875, 0.3125, 0.40625, 0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(warmup_steps=-1),
        dict(warmup_steps=2, start_factor=1.5),
        dict(warmup_steps=2, decay="step"),
        dict(warmup_steps=2, decay="cosine"),  # cosine needs total_steps
    ],
)
def test_warmup_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        linear_warmup(torch.optim.SGD(MLP(2, 2).parameters(), lr=0.1), **kwargs)


def test_linear_scaled_lr_follows_the_batch_size():
    assert linear_scaled_lr(0.1, 256 * 8, 256) == pytest.approx(0.8)
    assert math.isclose(linear_scaled_lr(0.1, 64, 256), 0.025)
    with pytest.raises(ValueError):
        linear_scaled_lr(0.1, 0, 256)


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_channels_last_step_on_cuda_trains():
    torch.manual_seed(0)
    model = SmallCNN(10, width=8).cuda()
    step = make_train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        autocast_dtype=torch.float16,
        channels_last=True,
    )
    x, y = torch.randn(32, 3, 32, 32, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    losses = torch.stack([step(x, y) for _ in range(20)])
    assert torch.isfinite(losses).all() and losses[-1] < losses[0], "the same batch 20 times: the loss must fall"
    assert step.scaler.get_scale() > 0
