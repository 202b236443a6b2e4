"""tricks_lib.memory: exact saved-for-backward bytes, state bytes, and errors."""

import pytest
import torch
from torch import nn

from tricks_lib.formatting import format_bytes
from tricks_lib.memory import MemoryReport, measure_memory, model_state_bytes


def linear_relu_chain(n, width=1024):
    layers = []
    for _ in range(n):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_chain_saves_exactly_n_plus_one_activations(n):
    model = linear_relu_chain(n)
    x = torch.randn(64, 1024)
    report = measure_memory(lambda: model(x), device="cpu")
    assert isinstance(report, MemoryReport)
    assert report.saved_bytes == (n + 1) * 64 * 1024 * 4
    assert report.saved_tensors == n + 1
    assert report.peak_allocated_bytes is None  # CPU has no allocator peaks


def test_forward_and_backward_in_one_call_counts_the_same():
    model = linear_relu_chain(3, width=256)
    x = torch.randn(32, 256)
    fwd = measure_memory(lambda: model(x), device="cpu")
    both = measure_memory(lambda: model(x).sum().backward(), device="cpu")
    assert both.saved_bytes == fwd.saved_bytes == 4 * 32 * 256 * 4


def test_peak_saved_bytes_of_accumulation_is_one_micro_batch():
    model = linear_relu_chain(2, width=256)
    x = torch.randn(64, 256)
    full = measure_memory(lambda: model(x).sum().backward(), device="cpu")
    micro = [xb.clone() for xb in x.chunk(4)]
    accumulated = measure_memory(lambda: [model(xb).sum().backward() for xb in micro], device="cpu")
    assert full.peak_saved_bytes == full.saved_bytes == 3 * 64 * 256 * 4
    # Every micro-batch saves a quarter, and its backward frees what it saved before the next pass saves
    # its own. The micro-batch inputs stay alive in `micro`, but once their pass is done no graph holds
    # them for backward: the peak is one micro-batch's input + 2 ReLU outputs, exactly a quarter.
    assert accumulated.saved_bytes == full.saved_bytes
    assert accumulated.peak_saved_bytes == 3 * 16 * 256 * 4 == full.peak_saved_bytes // 4
    assert "alive at once" in repr(accumulated)


def test_a_loop_over_held_batches_reports_one_steps_peak_not_the_sum():
    # The caller holds every batch (a list, as a cached dataset would); k training steps over them
    # must peak at one step's saved bytes, not k times it.
    model = linear_relu_chain(2, width=128)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(32, 128) for _ in range(5)]

    def steps(k):
        for xb in batches[:k]:
            opt.zero_grad()
            model(xb).sum().backward()
            opt.step()

    one, five = measure_memory(lambda: steps(1), device="cpu"), measure_memory(lambda: steps(5), device="cpu")
    assert one.peak_saved_bytes == 3 * 32 * 128 * 4
    assert five.peak_saved_bytes == one.peak_saved_bytes
    assert five.saved_bytes == 5 * one.saved_bytes  # every step saved its own input and activations


def test_a_saved_tensor_counts_until_its_graph_is_freed():
    x = torch.randn(256, 256, requires_grad=True)
    keep = []

    def forward_twice_keeping_the_first_graph():
        keep.append(x.exp())  # the first graph stays alive: its saved output still counts
        (x * 2).exp()  # this graph dies at once, yet its saved tensors were held while it lived

    report = measure_memory(forward_twice_keeping_the_first_graph, device="cpu")
    assert report.saved_bytes == 2 * 256 * 256 * 4
    assert report.peak_saved_bytes == 2 * 256 * 256 * 4  # both graphs were alive at the second save
    del keep[:]

    def graph_freed_before_the_next_save():
        x.exp().sum().backward()  # backward frees the saved exp output...
        x.exp().sum().backward()  # ...before this pass saves a new one

    freed = measure_memory(graph_freed_before_the_next_save, device="cpu")
    assert freed.peak_saved_bytes == 256 * 256 * 4


def test_parameters_and_their_views_are_excluded():
    w = nn.Parameter(torch.randn(16, 16))
    x = torch.randn(4, 16, requires_grad=True)
    # x @ w.t() saves x and a view of the parameter; only x is activation memory.
    report = measure_memory(lambda: x @ w.t(), device="cpu")
    assert report.saved_bytes == 4 * 16 * 4


def test_autocast_weight_copies_are_not_activations():
    model = linear_relu_chain(2)
    x = torch.randn(64, 1024)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = measure_memory(lambda: model(x), device="cpu")
    # bf16 copies of the input and of both ReLU outputs: 2 bytes each. The bf16 weight copies that
    # the second Linear saves are parameters in another dtype, not activations.
    assert report.saved_bytes == 3 * 64 * 1024 * 2
    assert report.saved_tensors == 3


def test_views_of_one_storage_count_once():
    x = torch.randn(100, requires_grad=True)

    def fn():
        y = x * 2  # y's storage: 400 bytes
        return (y[:50] * y[50:]).sum()  # both views of y are saved

    report = measure_memory(fn, device="cpu")
    assert report.saved_bytes == 400
    assert report.saved_tensors == 1


def test_checkpointing_saves_less():
    from torch.utils.checkpoint import checkpoint_sequential

    model = linear_relu_chain(8, width=256)
    x = torch.randn(32, 256, requires_grad=True)
    plain = measure_memory(lambda: model(x), device="cpu")
    ckpt = measure_memory(lambda: checkpoint_sequential(model, 4, x, use_reentrant=False), device="cpu")
    assert ckpt.saved_bytes < plain.saved_bytes


def test_no_grad_saves_nothing():
    model = linear_relu_chain(2, width=64)
    x = torch.randn(8, 64)
    with torch.no_grad():
        report = measure_memory(lambda: model(x), device="cpu")
    assert report.saved_bytes == 0 and report.saved_tensors == 0


def test_model_state_bytes_with_momentum():
    model = nn.Linear(10, 10)  # 110 parameters
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = model_state_bytes(model, opt)
    assert (before.parameters, before.gradients, before.optimizer_state) == (440, 0, 0)
    model(torch.randn(3, 10)).sum().backward()
    opt.step()
    after = model_state_bytes(model, opt)
    assert after.gradients == 440
    assert after.optimizer_state == 440  # one momentum buffer per parameter
    assert after.total == 3 * 440


def test_forward_only_graph_is_freed_after_the_call():
    import gc
    import weakref

    model = linear_relu_chain(2, width=64)
    x = torch.randn(8, 64)
    kept = {}
    measure_memory(lambda: kept.update(y=model(x)), device="cpu")
    ref = weakref.ref(kept.pop("y"))
    gc.collect()
    assert ref() is None  # no reference cycle through the saved-tensor hooks


def test_gradients_unchanged_and_inplace_check_kept():
    model = linear_relu_chain(2, width=32)
    x = torch.randn(4, 32)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    measure_memory(lambda: model(x).sum().backward(), device="cpu")
    assert all(torch.equal(e, p.grad) for e, p in zip(expected, model.parameters()))
    a = torch.randn(4, requires_grad=True)

    def corrupting():
        y = a.sigmoid()  # sigmoid saves its output
        y.mul_(2)  # ...which this overwrites
        y.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        measure_memory(corrupting, device="cpu")


def test_errors_and_format():
    with pytest.raises(TypeError, match="callable"):
        measure_memory("model")
    with pytest.raises(TypeError, match="nn.Module"):
        model_state_bytes("model")
    with pytest.raises(TypeError, match="Optimizer"):
        model_state_bytes(nn.Linear(2, 2), optimizer=[1])
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"
    assert format_bytes(None) == "-"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peaks_reported():
    model = linear_relu_chain(2).cuda()
    x = torch.randn(64, 1024, device="cuda")
    report = measure_memory(lambda: model(x), device="cuda")
    assert report.saved_bytes == 3 * 64 * 1024 * 4
    assert report.peak_allocated_bytes >= report.allocated_before_bytes + report.saved_bytes


def test_a_saved_sparse_tensor_counts_its_index_and_value_bytes_not_its_dense_size():
    # 2 nonzeros of a 10,000 x 10,000 matrix: 2x2 int64 indices + 2 float32 values = 40 bytes
    # (its dense size, numel() * 4, would be 400 MB).
    with torch.sparse.check_sparse_tensor_invariants(True):
        sparse = torch.sparse_coo_tensor(torch.tensor([[0, 9999], [5, 7]]), torch.tensor([1.0, 2.0]), (10_000, 10_000))
    weight = torch.randn(10_000, 4, requires_grad=True)
    report = measure_memory(lambda: torch.sparse.mm(sparse, weight), device="cpu")
    assert report.saved_bytes == 2 * 2 * 8 + 2 * 4 and report.saved_tensors == 1
    csr = sparse.to_sparse_csr()
    report = measure_memory(lambda: torch.sparse.mm(csr, weight), device="cpu")
    assert report.saved_bytes == (10_001 + 2) * 8 + 2 * 4  # crow_indices, col_indices, values
