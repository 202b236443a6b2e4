"""Tests for tricks_lib.repro: seeding, fingerprints, deterministic mode, worker seeding, resume."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tricks_lib.repro import (
    NoiseAugmentedDataset,
    determinism_flags,
    deterministic,
    fingerprint,
    seed_everything,
    seed_worker,
)


@pytest.fixture(autouse=True)
def _keep_global_state():
    """Every test leaves RNGs, determinism flags and the environment as it found them."""
    rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    flags = determinism_flags()
    env = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")}
    yield
    random.setstate(rng[0])
    np.random.set_state(rng[1])
    torch.set_rng_state(rng[2])
    torch.use_deterministic_algorithms(flags.algorithms, warn_only=flags.warn_only)
    torch.backends.cudnn.deterministic = flags.cudnn_deterministic
    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _draws() -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


# --- seeding -----------------------------------------------------------------------------------


def test_same_seed_same_draws_and_same_fingerprint():
    seed_everything(123)
    first, model_a = _draws(), nn.Linear(8, 4)
    seed_everything(123)
    second, model_b = _draws(), nn.Linear(8, 4)
    assert first == second
    assert fingerprint(model_a) == fingerprint(model_b)
    seed_everything(124)
    assert fingerprint(nn.Linear(8, 4)) != fingerprint(model_a)


def test_seed_everything_sets_pythonhashseed_for_children():
    seed_everything(7)
    assert os.environ["PYTHONHASHSEED"] == "7"


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_out_of_range_seed_raises_value_error(bad):
    with pytest.raises(ValueError, match="2\\*\\*32"):
        seed_everything(bad)


@pytest.mark.parametrize("bad", [1.5, "0", True, None])
def test_non_int_seed_raises_type_error(bad):
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(bad)


# --- fingerprint -------------------------------------------------------------------------------


def test_fingerprint_is_stable_across_processes_and_versions():
    # A hard-coded value: the fingerprint is a hash of bytes, not of Python object ids.
    assert fingerprint(torch.arange(4, dtype=torch.float32)) == "dd982aa6a382136c"
    assert len(fingerprint(torch.zeros(1))) == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_one_ulp_change_changes_fingerprint(dtype):
    seed_everything(0)
    model = nn.Linear(16, 16).to(dtype)
    before = fingerprint(model)
    with torch.no_grad():
        w = model.weight
        w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(float("inf"), dtype=dtype))
    assert fingerprint(model) != before


def test_fingerprint_sees_dtype_shape_sign_and_names():
    zeros = torch.zeros(4)
    assert fingerprint(zeros) != fingerprint(torch.zeros(4, dtype=torch.int32))  # same bytes, other dtype
    assert fingerprint(zeros) != fingerprint(zeros.reshape(2, 2))
    assert fingerprint(zeros) != fingerprint(-zeros)  # -0.0 has other bytes than 0.0
    assert fingerprint({"a": zeros}) != fingerprint({"b": zeros})


def test_fingerprint_ignores_layout_device_and_dict_order():
    x = torch.arange(12.0).reshape(3, 4)
    assert fingerprint(x.t()) == fingerprint(x.t().contiguous())
    assert fingerprint(x.requires_grad_()) == fingerprint(x.detach())
    assert fingerprint({"a": x, "b": 1}) == fingerprint({"b": 1, "a": x})


def test_fingerprint_accepts_module_state_dict_iterables_and_optimizer_state():
    seed_everything(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    assert fingerprint(model) == fingerprint(model.state_dict())
    assert fingerprint(model.parameters()) == fingerprint(list(model.parameters()))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    assert isinstance(fingerprint(opt.state_dict()), str)


@pytest.mark.parametrize("bad", ["abc", 3, 1.0, None, object(), [torch.zeros(1), object()]])
def test_fingerprint_rejects_unsupported_objects(bad):
    with pytest.raises(TypeError, match="fingerprint"):
        fingerprint(bad)


def test_fingerprint_rejects_sparse_tensors():
    with pytest.raises(TypeError, match="to_dense"):
        fingerprint(torch.eye(3).to_sparse())


# --- deterministic() ---------------------------------------------------------------------------


def _set_flags_to_unusual_values() -> None:
    torch.use_deterministic_algorithms(False, warn_only=False)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True


def _fake_cuda(monkeypatch, *, initialized: bool) -> None:
    """Make this process look like one with CUDA available, initialized or not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)


def _no_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)


def test_deterministic_sets_and_restores_every_flag(monkeypatch):
    _no_cuda(monkeypatch)
    _set_flags_to_unusual_values()
    before = determinism_flags()
    with deterministic() as flags:
        now = determinism_flags()
        assert now == flags
        assert now.algorithms and now.cudnn_deterministic and not now.cudnn_benchmark
        assert now.mkldnn_deterministic in (True, None)
        assert torch.are_deterministic_algorithms_enabled()
    assert determinism_flags() == before


def test_deterministic_restores_on_exception(monkeypatch):
    _no_cuda(monkeypatch)
    before = determinism_flags()
    with pytest.raises(RuntimeError, match="boom"):
        with deterministic(warn_only=True):
            assert torch.is_deterministic_algorithms_warn_only_enabled()
            raise RuntimeError("boom")
    assert determinism_flags() == before


@pytest.mark.parametrize("value", [None, ":0:0"])
def test_deterministic_without_cuda_leaves_cublas_variable_alone(monkeypatch, value):
    _no_cuda(monkeypatch)
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with deterministic() as flags:
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == value == flags.cublas_workspace_config
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == value


@pytest.mark.parametrize("value", [None, ":0:0"])
def test_deterministic_raises_when_cuda_is_initialized_without_cublas_config(monkeypatch, value):
    # cuBLAS read the variable at its first call: setting it now would pass PyTorch's check and change
    # nothing. The old code set it for the block and carried on.
    _fake_cuda(monkeypatch, initialized=True)
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    before = determinism_flags()
    with pytest.raises(RuntimeError, match="CUBLAS_WORKSPACE_CONFIG.*before torch initializes CUDA"):
        with deterministic():
            pytest.fail("the block must not run")
    assert determinism_flags() == before  # nothing was changed, the variable included
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == value


@pytest.mark.parametrize("value", [":4096:8", ":16:8"])
def test_deterministic_accepts_an_existing_deterministic_cublas_value_on_initialized_cuda(monkeypatch, value):
    _fake_cuda(monkeypatch, initialized=True)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with deterministic() as flags:
        assert flags.cublas_workspace_config == value == os.environ["CUBLAS_WORKSPACE_CONFIG"]
        assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == value


@pytest.mark.parametrize("value", [None, ":0:0"])
def test_deterministic_sets_cublas_config_for_the_rest_of_the_process_before_cuda_init(monkeypatch, value):
    # Not restored on exit: cuBLAS reads it at its first call, which may come after the block.
    _fake_cuda(monkeypatch, initialized=False)
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with deterministic() as flags:
        assert flags.cublas_workspace_config == ":4096:8" == os.environ["CUBLAS_WORKSPACE_CONFIG"]
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()  # the switches themselves are restored


def test_deterministic_false_never_touches_cublas_config(monkeypatch):
    _fake_cuda(monkeypatch, initialized=True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with deterministic(False) as flags:
        assert flags.cublas_workspace_config is None
        assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_deterministic_keeps_an_existing_deterministic_cublas_value_and_nests(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with deterministic():
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        with deterministic(False):
            assert not torch.are_deterministic_algorithms_enabled()
            assert not torch.backends.cudnn.deterministic
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_fills_uninitialized_memory_on_cpu():
    # A visible CPU effect of deterministic mode: torch.empty is filled with NaN.
    if not torch.utils.deterministic.fill_uninitialized_memory:
        pytest.skip("fill_uninitialized_memory is off in this process")
    with deterministic():
        assert torch.isnan(torch.empty(16)).all()


def test_deterministic_rejects_non_bool():
    with pytest.raises(TypeError):
        with deterministic(1):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CPU kernels of histc are deterministic")
def test_nondeterministic_cuda_op_raises_in_deterministic_mode():
    with deterministic(), pytest.raises(RuntimeError, match="deterministic"):
        torch.histc(torch.rand(100, device="cuda"))


_CUDA_CHILD = """
import torch
from tricks_lib.repro import deterministic
a = torch.randn(64, 64, device="cuda")
(a @ a).sum().item()  # cuBLAS has read its workspace configuration now
try:
    with deterministic():
        (a @ a).sum().item()
    print("ran")
except RuntimeError as error:
    print("raised" if "before torch initializes CUDA" in str(error) else f"other: {error}")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: cuBLAS reads CUBLAS_WORKSPACE_CONFIG")
@pytest.mark.parametrize("value, expected", [(None, "raised"), (":4096:8", "ran")])
def test_deterministic_on_cuda_after_a_matmul_needs_the_variable_from_the_start(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if value is not None:
        env["CUBLAS_WORKSPACE_CONFIG"] = value
    result = subprocess.run([sys.executable, "-c", _CUDA_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


# --- worker seeding ----------------------------------------------------------------------------

N_SAMPLES, BATCH, WORKERS = 32, 4, 2


def _noise_per_epoch(worker_init_fn, *, epochs=2, generator=None) -> list[torch.Tensor]:
    """The noise every sample received, per epoch: inputs are zeros, so the output is the noise."""
    ds = NoiseAugmentedDataset(torch.zeros(N_SAMPLES, 3), torch.zeros(N_SAMPLES), noise_std=1.0, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, worker_init_fn=worker_init_fn, generator=generator)
    return [torch.cat([x for x, _ in loader]) for _ in range(epochs)]  # each (N_SAMPLES, 3)


def test_generator_created_in_init_is_duplicated_across_workers_and_epochs():
    epoch0, epoch1 = _noise_per_epoch(None)
    # Each worker replays the same draws: only N / WORKERS distinct noise vectors...
    assert len(torch.unique(epoch0, dim=0)) == N_SAMPLES // WORKERS
    # ...and every epoch repeats the previous one.
    assert torch.equal(epoch0, epoch1)


def test_numpy_global_generator_is_reseeded_per_worker_since_torch_1_9():
    # The pre-1.9 bug (forked workers sharing NumPy's global state) is fixed in PyTorch itself.
    ds = NoiseAugmentedDataset(torch.zeros(N_SAMPLES, 3), torch.zeros(N_SAMPLES), noise_std=1.0, own_generator=False)
    noise = torch.cat([x for x, _ in DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)])
    assert len(torch.unique(noise, dim=0)) == N_SAMPLES


def test_seed_worker_removes_the_duplicates():
    epoch0, epoch1 = _noise_per_epoch(seed_worker)
    assert len(torch.unique(epoch0, dim=0)) == N_SAMPLES
    assert len(torch.unique(torch.cat([epoch0, epoch1]), dim=0)) == 2 * N_SAMPLES


def _recipe_worker_init(worker_id: int) -> None:
    """The worker_init_fn of PyTorch's reproducibility notes, plus the dataset's reseed hook (notebook 07's lines)."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    torch.utils.data.get_worker_info().dataset.reseed(worker_seed)


def test_seed_worker_draws_what_the_recipe_lines_draw():
    ours = _noise_per_epoch(seed_worker, generator=torch.Generator().manual_seed(5))
    recipe = _noise_per_epoch(_recipe_worker_init, generator=torch.Generator().manual_seed(5))
    assert fingerprint(ours) == fingerprint(recipe)


def test_seeded_generator_makes_worker_draws_reproducible():
    a = _noise_per_epoch(seed_worker, generator=torch.Generator().manual_seed(3))
    b = _noise_per_epoch(seed_worker, generator=torch.Generator().manual_seed(3))
    c = _noise_per_epoch(seed_worker, generator=torch.Generator().manual_seed(4))
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


def test_seed_worker_validates_worker_id():
    with pytest.raises(ValueError):
        seed_worker(-1)
    with pytest.raises(TypeError):
        seed_worker("0")


def test_dataset_validates_arguments():
    with pytest.raises(ValueError, match="first dimension"):
        NoiseAugmentedDataset(torch.zeros(4, 2), torch.zeros(5))
    with pytest.raises(TypeError):
        NoiseAugmentedDataset(torch.zeros(4, 2, dtype=torch.long), torch.zeros(4))
    with pytest.raises(ValueError):
        NoiseAugmentedDataset(torch.zeros(4, 2), torch.zeros(4), seed=-3)
    with pytest.raises(ValueError, match="own_generator"):
        NoiseAugmentedDataset(torch.zeros(4, 2), torch.zeros(4), seed=1, own_generator=False)


# --- review fixes: unordered inputs, NumPy scalars ---


def test_fingerprint_rejects_unordered_collections():
    x = torch.zeros(2)
    for unordered in ({x}, frozenset({x}), {"a": x}.keys(), {"a": x}.items()):
        with pytest.raises(TypeError, match="no stable order"):
            fingerprint(unordered)
    with pytest.raises(TypeError, match="no stable order"):
        fingerprint({"a": {1, 2}})  # nested too
    assert fingerprint({"a": x}.values()) == fingerprint([x])  # values() keeps insertion order: allowed


def test_fingerprint_accepts_numpy_scalars_as_python_numbers():
    assert fingerprint({"step": np.int64(3)}) == fingerprint({"step": 3})
    assert fingerprint({"lr": np.float64(0.5)}) == fingerprint({"lr": 0.5})
    assert fingerprint({"lr": np.float32(0.5)}) != fingerprint({"lr": 0.25})
    assert fingerprint({"ok": np.bool_(True)}) == fingerprint({"ok": True})


def test_deterministic_blocks_exited_out_of_order_leave_the_flags_as_before_and_say_so():
    from tricks_lib.repro import deterministic

    before = torch.are_deterministic_algorithms_enabled()
    outer, inner = deterministic(), deterministic(False)
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(RuntimeError, match="still open"):
        outer.__exit__(None, None, None)  # out of order: the inner block is still open
    assert torch.are_deterministic_algorithms_enabled() == before
    inner.__exit__(None, None, None)  # closed already by the outer exit: changes nothing
    assert torch.are_deterministic_algorithms_enabled() == before
    with deterministic():  # nested in order: each exit restores what its block found
        with deterministic(False):
            assert not torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before
