"""Tests for the claims of the "Saving memory" notebook, measured with tricks_lib.memory on the CPU.

Checkpointing: same gradients, and the bound on saved activations. For a stack of n blocks
(Linear -> ReLU, each saving one (B, W) activation), the plain forward saves n + 1 activations (the
input and each block's output). ``checkpoint_sequential`` with s segments keeps the s - 1 checkpointed
segments' inputs plus the last segment, which it runs without checkpointing (n/s outputs and its
input): s + n/s activations. With s = sqrt(n) that is 2 sqrt(n), against n + 1 (Chen et al. 2016).

Gradient accumulation: over a whole step of k micro-batches, the most saved bytes alive at once
(``peak_saved_bytes``) is exactly 1/k of the full batch step's, although the total saved is the same.
"""

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from tricks_lib.memory import measure_memory, model_state_bytes

BATCH, WIDTH = 8, 32
ACTIVATION = BATCH * WIDTH * 4  # bytes of one float32 (B, W) activation


def stack(depth: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(depth)])


def grads_of(model: nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def per_block_checkpoint(model, x, use_reentrant):
    for block in model:
        x = checkpoint(block, x, use_reentrant=use_reentrant)
    return x


def test_checkpointed_and_plain_runs_give_the_same_gradients():
    model = stack(6)
    x = torch.randn(BATCH, WIDTH, requires_grad=True)  # reentrant checkpoint needs an input that requires grad
    plain = grads_of(model, model(x).pow(2).sum())
    variants = {
        "non-reentrant": lambda: per_block_checkpoint(model, x, False),
        "reentrant": lambda: per_block_checkpoint(model, x, True),
        "sequential": lambda: checkpoint_sequential(model, 3, x, use_reentrant=False),
        "sequential reentrant": lambda: checkpoint_sequential(model, 3, x, use_reentrant=True),
    }
    for name, run in variants.items():
        for got, want in zip(grads_of(model, run().pow(2).sum()), plain):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{name} differs from plain")


@pytest.mark.parametrize("depth", [4, 16, 64])
def test_plain_stack_saves_one_activation_per_block_plus_the_input(depth):
    model = stack(depth)
    x = torch.randn(BATCH, WIDTH)
    assert measure_memory(lambda: model(x), device="cpu").saved_bytes == (depth + 1) * ACTIVATION


@pytest.mark.parametrize("depth", [4, 16, 64])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_sqrt_checkpointing_saves_2_sqrt_n_activations(depth, use_reentrant):
    model = stack(depth)
    x = torch.randn(BATCH, WIDTH, requires_grad=use_reentrant)
    segments = math.isqrt(depth)  # depths are squares: n/s = s
    saved = measure_memory(
        lambda: checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant), device="cpu"
    ).saved_bytes
    assert saved == (segments + depth // segments) * ACTIVATION  # = 2 sqrt(n) activations
    assert saved < (depth + 1) * ACTIVATION  # below the plain stack's n + 1


def test_checkpointing_updates_batchnorm_running_statistics_twice():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH))
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert block[1].num_batches_tracked.item() == 2  # forward, then the recompute in backward


def test_gradient_accumulation_equals_the_full_batch_without_batchnorm():
    model = stack(3)
    x, y = torch.randn(4 * BATCH, WIDTH), torch.randn(4 * BATCH, WIDTH)
    loss_fn = nn.MSELoss()
    full = grads_of(model, loss_fn(model(x), y))
    model.zero_grad(set_to_none=True)
    for xb, yb in zip(x.chunk(4), y.chunk(4)):
        (loss_fn(model(xb), yb) / 4).backward()  # mean loss: divide by the number of micro-batches
    for got, want in zip((p.grad for p in model.parameters()), full):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_is_not_exact_with_batchnorm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))
    x, y = torch.randn(4 * BATCH, WIDTH), torch.randn(4 * BATCH, 1)
    full = grads_of(model, nn.functional.mse_loss(model(x), y))
    model.zero_grad(set_to_none=True)
    for xb, yb in zip(x.chunk(4), y.chunk(4)):
        (nn.functional.mse_loss(model(xb), yb) / 4).backward()
    first = model[0].weight.grad
    assert (first - full[0]).norm() / full[0].norm() > 1e-3  # per-micro-batch statistics differ


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_step_peak_is_one_kth_of_the_full_batch_step(k):
    """The whole step, forward and backward: k micro-batches keep 1/k of the full batch alive at once."""
    depth = 4
    model = stack(depth)
    x = torch.randn(k * BATCH, WIDTH)

    def full_step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    def accumulated_step():
        model.zero_grad(set_to_none=True)
        for xb in x.chunk(k):
            xb = xb.clone()  # own storage, as a data loader hands it over (a view would keep all of x)
            (model(xb).pow(2).mean() / k).backward()  # frees this micro-batch's saved tensors

    full = measure_memory(full_step, device="cpu")
    accumulated = measure_memory(accumulated_step, device="cpu")
    # Each pass saves the input and every ReLU output (pow saves the last one again: same storage).
    assert full.peak_saved_bytes == full.saved_bytes == (depth + 1) * k * ACTIVATION
    assert accumulated.peak_saved_bytes == (depth + 1) * ACTIVATION  # exactly 1/k
    assert accumulated.peak_saved_bytes * k == full.peak_saved_bytes
    # Added up over the call, the k micro-batches save as much as the full batch: not the peak.
    assert accumulated.saved_bytes == full.saved_bytes


def test_micro_batches_sliced_as_views_keep_the_whole_input_alive():
    """Why the notebook copies each micro-batch: a saved view counts (and keeps) its whole storage."""
    k, depth = 4, 4
    model = stack(depth)
    x = torch.randn(k * BATCH, WIDTH)

    def accumulated_views():
        for xb in x.chunk(k):
            (model(xb).pow(2).mean() / k).backward()

    peak = measure_memory(accumulated_views, device="cpu").peak_saved_bytes
    assert peak == k * ACTIVATION + depth * ACTIVATION  # the whole x, plus one micro-batch's ReLU outputs


def test_inplace_relu_saves_the_same_bytes_after_linear():
    x = torch.randn(BATCH, WIDTH)
    saved = {}
    for inplace in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(inplace=inplace), nn.Linear(WIDTH, WIDTH))
        saved[inplace] = measure_memory(lambda model=model: model(x), device="cpu").saved_bytes
    assert saved[False] == saved[True] == 2 * ACTIVATION  # input, ReLU output; Linear's output is not kept


def test_inplace_op_on_a_saved_tensor_fails_in_backward():
    x = torch.randn(BATCH, requires_grad=True)
    y = torch.sigmoid(x)  # sigmoid saves its output for backward
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_no_grad_and_inference_mode_save_nothing_but_eval_does():
    model = stack(3).eval()
    x = torch.randn(BATCH, WIDTH)
    assert measure_memory(lambda: model(x), device="cpu").saved_bytes == 4 * ACTIVATION

    def no_grad():
        with torch.no_grad():
            return model(x)

    def inference():
        with torch.inference_mode():
            return model(x)

    assert measure_memory(no_grad, device="cpu").saved_bytes == 0
    assert measure_memory(inference, device="cpu").saved_bytes == 0


def test_frozen_backbone_saves_only_the_head_and_gets_no_gradients():
    model = stack(4)
    for p in model[:3].parameters():
        p.requires_grad_(False)
    x = torch.randn(BATCH, WIDTH)
    assert measure_memory(lambda: model(x), device="cpu").saved_bytes == 2 * ACTIVATION  # head input, its ReLU
    model(x).sum().backward()
    state = model_state_bytes(model)
    assert state.gradients == (WIDTH * WIDTH + WIDTH) * 4  # the head's weight and bias only


# --- deleting and rebinding; autocast's saved bytes per sample -----------------------------------


def _loop(model: nn.Module, *, backward: bool, use_del: bool, iterations: int = 3) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(iterations):
        x = torch.randn(BATCH, WIDTH, generator=g)  # created inside the loop, as a loader hands it over
        out = model(x)
        loss = out.pow(2).mean()
        if backward:
            loss.backward()
        if use_del:
            del out, loss


@pytest.mark.parametrize("backward", [False, True])
def test_rebinding_without_backward_keeps_two_graphs_and_del_keeps_one(backward):
    model = stack(3)
    one = measure_memory(lambda: _loop(model, backward=False, use_del=False, iterations=1)).saved_bytes
    rebinding = measure_memory(lambda: _loop(model, backward=backward, use_del=False))
    deleting = measure_memory(lambda: _loop(model, backward=backward, use_del=True))
    assert deleting.peak_saved_bytes == one
    # Without backward the previous iteration's graph is alive during the next forward. Backward frees
    # the graph's saved tensors: `out` (the last ReLU's output) stays alive until it is rebound, but no
    # graph holds it for backward any more, so it is no longer saved memory.
    assert rebinding.peak_saved_bytes == (2 * one if not backward else one)
    assert rebinding.saved_bytes == deleting.saved_bytes == 3 * one  # del changes lifetimes, not totals


def test_autocast_saves_16_bit_activations_plus_the_input_copy_and_the_float_output():
    depth = 4
    model = stack(depth)

    def saved(batch, dtype):
        x = torch.randn(batch, WIDTH)

        def forward():
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                model(x).float().pow(2).mean()

        return measure_memory(forward).saved_bytes

    plain = saved(2, None) - saved(1, None)
    amp = saved(2, torch.bfloat16) - saved(1, torch.bfloat16)
    assert plain == (depth + 1) * 4 * WIDTH  # the input and each ReLU output, float32
    assert amp == ((depth + 1) * 2 + 4) * WIDTH  # bf16 input copy + bf16 ReLU outputs + float32 output


def test_batchnorm_under_cpu_autocast_saves_16_bit_tensors():
    # The notebook no longer claims BatchNorm stays in fp32 under CPU autocast: it does not.
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    x = torch.randn(4, 3, 8, 8)

    def step(enabled):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            model(x).float().sum()

    ratio = measure_memory(lambda: step(False)).saved_bytes / measure_memory(lambda: step(True)).saved_bytes
    assert ratio > 1.9


def _profiled_allocations(fn) -> tuple[int, dict[str, int]]:
    """(net bytes all operators allocated, inclusive bytes per operator) in one call, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    averages = prof.key_averages()
    total = sum(e.self_cpu_memory_usage for e in averages if e.key != "[memory]")
    return total, {e.key: e.cpu_memory_usage for e in averages}


def test_inplace_relu_allocates_nothing_where_out_of_place_allocates_its_output(monkeypatch):
    # What notebook 03 shows with the profiler: saved-for-backward bytes are the same either way, but the
    # out-of-place ReLU allocates a new output and the in-place one writes into its input.
    monkeypatch.setenv("KINETO_LOG_LEVEL", "6")  # keep the profiler's start/stop log off stderr
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU())
    x = torch.randn(BATCH, WIDTH)
    total_out, by_op_out = _profiled_allocations(lambda: model(x))
    model[2].inplace = True
    total_in, by_op_in = _profiled_allocations(lambda: model(x))
    assert by_op_out["aten::relu"] == ACTIVATION
    assert by_op_in["aten::relu_"] == 0
    assert total_out - total_in == ACTIVATION


def test_cpu_grad_scaler_skips_an_overflowing_fp16_step_and_halves_the_scale():
    # Notebook 03 runs float16 autocast with torch.amp.GradScaler("cpu") on any device.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 4))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scale = scaler.get_scale()

    def step(x):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), torch.zeros(BATCH, dtype=torch.long))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    step(torch.randn(BATCH, WIDTH) * 1e6)  # beyond float16's range: inf/nan gradients
    assert scaler.get_scale() == scale / 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    step(torch.randn(BATCH, WIDTH))
    assert scaler.get_scale() == scale / 2  # taken: not lowered again
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
