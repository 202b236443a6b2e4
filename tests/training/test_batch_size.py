"""Tests for tricks_lib.training.batch_size: the largest batch that fits a memory budget."""

import pytest
import torch
import torch.nn as nn

from tricks_lib.memory import measure_memory
from tricks_lib.training.batch_size import BatchProbe, BatchSearch, largest_batch

WIDTH = 16
BYTES_PER_SAMPLE = WIDTH * 4  # relu saves its float32 output: one row of WIDTH floats per sample


def relu_step(batch: int):
    """A step that saves exactly batch * BYTES_PER_SAMPLE bytes for backward."""
    x = torch.randn(batch, WIDTH, requires_grad=True)
    return lambda: torch.relu(x).sum()


def saved_bytes_of(make_step, batch: int) -> int:
    return measure_memory(make_step(batch), device="cpu").saved_bytes


def test_relu_step_saves_what_the_tests_assume():
    assert saved_bytes_of(relu_step, 7) == 7 * BYTES_PER_SAMPLE


@pytest.mark.parametrize("budget", [BYTES_PER_SAMPLE, 1000, 64 * 100, 64 * 100 + 63, 64 * 1000 - 1])
def test_returns_exactly_the_largest_batch_within_the_budget(budget):
    result = largest_batch(relu_step, budget_bytes=budget, device="cpu")
    assert result.batch_size == budget // BYTES_PER_SAMPLE
    assert result.used_bytes == result.batch_size * BYTES_PER_SAMPLE <= budget
    assert (result.batch_size + 1) * BYTES_PER_SAMPLE > budget


def test_never_exceeds_the_budget_and_matches_brute_force_on_a_real_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8), nn.Tanh())

    def make_step(batch):
        x = torch.randn(batch, 8)
        return lambda: model(x).sum()

    sizes = {b: saved_bytes_of(make_step, b) for b in range(1, 80)}
    for budget in (sizes[1], sizes[10] + 5, sizes[33], sizes[64] - 1, sizes[79] - 1):
        result = largest_batch(make_step, budget_bytes=budget, device="cpu", high=79)
        best = max(b for b, used in sizes.items() if used <= budget)
        assert result.batch_size == best
        assert all(p.used_bytes <= budget for p in result.probes if p.fits)
        assert all(p.used_bytes > budget for p in result.probes if not p.fits)


def test_probes_double_then_bisect():
    result = largest_batch(relu_step, budget_bytes=20 * BYTES_PER_SAMPLE, device="cpu")
    tried = [p.batch_size for p in result.probes]
    assert tried[:6] == [1, 2, 4, 8, 16, 32]  # doubling until 32 does not fit
    assert tried[6:] == [24, 20, 22, 21]  # bisection of [16, 32)
    assert isinstance(result, BatchSearch) and all(isinstance(p, BatchProbe) for p in result.probes)
    assert result.criterion == "saved for backward"


def test_high_caps_the_search_and_is_reported():
    result = largest_batch(relu_step, budget_bytes=10**9, device="cpu", low=3, high=40)
    assert result.batch_size == 40 and result.reached_high
    assert [p.batch_size for p in result.probes] == [3, 6, 12, 24, 40]


def test_result_is_frozen_and_has_a_readable_repr():
    result = largest_batch(relu_step, budget_bytes=1000, device="cpu")
    with pytest.raises(AttributeError):
        result.batch_size = 3
    assert "largest batch 15" in repr(result)
    assert "<table>" in result._repr_html_()
    assert result.to_dict()["batch_size"] == 15


def test_low_that_does_not_fit_raises():
    with pytest.raises(ValueError, match="does not fit"):
        largest_batch(relu_step, budget_bytes=BYTES_PER_SAMPLE * 4, device="cpu", low=5)


def test_argument_errors():
    with pytest.raises(ValueError, match="budget_bytes"):
        largest_batch(relu_step, device="cpu")  # no budget on a CPU
    with pytest.raises(TypeError):
        largest_batch("not callable", budget_bytes=100, device="cpu")
    with pytest.raises(TypeError, match="zero-argument callable"):
        largest_batch(lambda b: 3, budget_bytes=100, device="cpu")
    with pytest.raises(ValueError, match="positive"):
        largest_batch(relu_step, budget_bytes=0, device="cpu")
    with pytest.raises(TypeError):
        largest_batch(relu_step, budget_bytes=100.0, device="cpu")
    with pytest.raises(ValueError, match="at least low"):
        largest_batch(relu_step, budget_bytes=100, device="cpu", low=8, high=4)
    with pytest.raises(ValueError):
        largest_batch(relu_step, budget_bytes=100, device="cpu", low=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_out_of_memory_is_caught_and_memory_released():
    device = torch.device("cuda")
    threshold = 37

    def make_step(batch):
        def step():
            held = torch.empty(batch, 1 << 20, dtype=torch.uint8, device=device)  # batch MiB
            if batch > threshold:  # stands in for a real OOM, deterministic on any GPU size
                raise torch.cuda.OutOfMemoryError(f"pretend out of memory at batch {batch}")
            return held.sum()

        return step

    before = torch.cuda.memory_allocated(device)
    result = largest_batch(make_step, device=device)
    assert result.batch_size == threshold
    assert any(p.out_of_memory for p in result.probes)
    assert torch.cuda.memory_allocated(device) == before  # nothing left behind by the failed probes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_budget_on_peak_allocated():
    device = torch.device("cuda")
    base = torch.cuda.memory_allocated(device)

    def make_step(batch):
        return lambda: torch.empty(batch, 1 << 20, dtype=torch.uint8, device=device).sum()

    budget = base + 50 * (1 << 20)
    result = largest_batch(make_step, budget_bytes=budget, device=device, high=200)
    assert result.used_bytes <= budget
    assert 40 <= result.batch_size <= 50  # allocator rounding and the sum's output cost a little


def test_a_step_that_saves_nothing_is_an_error_not_a_huge_batch():
    model = nn.Linear(16, 16)

    def make_step(batch):
        def step():
            with torch.no_grad():  # evaluation: nothing is saved, whatever the batch
                model(torch.randn(batch, 16))

        return step

    with pytest.raises(ValueError, match="saved nothing for backward"):
        largest_batch(make_step, budget_bytes=2**20, device="cpu", high=2**12)
