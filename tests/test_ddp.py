"""Tests for tricks_lib.training.ddp: a real 2-process gloo run launched with torchrun through sys.executable."""

import pytest
import torch

from tricks_lib.measurements import Measurement
from tricks_lib.training.ddp import DDPResult, free_port, launch_ddp

pytestmark = pytest.mark.slow  # every test here launches processes


@pytest.fixture(scope="module")
def ddp_accumulating() -> DDPResult:
    # Gradient accumulation covers both paths: no_sync() micro-batches and the synchronizing last one.
    return launch_ddp(
        nproc=2, backend="gloo", steps=3, warmup_steps=1, batch_size=8, accumulation_steps=2,
        width=4, image_size=16, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ddp_accumulating_without_no_sync() -> DDPResult:
    # The baseline for no_sync: the same accumulation, an all-reduce after every micro-batch.
    return launch_ddp(
        nproc=2, backend="gloo", steps=3, warmup_steps=1, batch_size=8, accumulation_steps=2, no_sync=False,
        width=4, image_size=16, timeout=120,
    )  # fmt: skip


def test_two_gloo_ranks_end_with_identical_parameters(ddp_accumulating):
    r = ddp_accumulating
    assert (r.world_size, r.backend, r.device, r.accumulation_steps) == (2, "gloo", "cpu", 2)
    # The ranks start from different seeds and see different data: equality is DDP's doing.
    assert r.params_identical and r.max_param_difference == 0.0
    assert r.num_parameters > 0 and len(r.step_times) == 3
    assert r.samples_per_second > 0 and r.final_loss > 0


def test_result_converts_to_a_measurement(ddp_accumulating):
    m = ddp_accumulating.as_measurement()
    assert isinstance(m, Measurement)
    assert m.times == ddp_accumulating.step_times and m.items == 2 * 8
    assert "identical" in repr(ddp_accumulating)


def test_a_run_past_its_timeout_is_stopped():
    with pytest.raises(TimeoutError):
        launch_ddp(nproc=2, backend="gloo", steps=1000, batch_size=8, width=4, image_size=16, timeout=0.5)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has GPUs for nccl")
def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match="GPUs"):
        launch_ddp(nproc=2, backend="nccl")


@pytest.mark.parametrize("kwargs", [dict(nproc=0), dict(batch_size=2, accumulation_steps=4), dict(backend="mpi")])
def test_bad_arguments_are_refused_before_launching(kwargs):
    with pytest.raises(ValueError):
        launch_ddp(**kwargs)


def test_no_sync_must_be_a_bool():
    with pytest.raises(TypeError, match="no_sync"):
        launch_ddp(no_sync="yes")


def test_free_port_is_a_valid_port():
    assert 1024 <= free_port() <= 65535


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for nccl")
def test_two_nccl_ranks_end_with_identical_parameters():
    r = launch_ddp(nproc=2, backend="nccl", steps=3, batch_size=8, width=4, image_size=16, timeout=180)
    assert (r.backend, r.device) == ("nccl", "cuda") and r.params_identical


def test_no_sync_skips_the_allreduce_of_all_but_the_last_micro_batch(ddp_accumulating):
    # A comm hook counts DDP's all-reduces: one per bucket on each synchronizing backward. Without
    # no_sync() every micro-batch would all-reduce (accumulation_steps times as many calls).
    r = ddp_accumulating
    assert r.buckets >= 1 and r.backward_passes == r.steps * r.accumulation_steps
    assert r.allreduce_calls == r.steps * r.buckets
    assert r.allreduce_calls < r.backward_passes * r.buckets
    assert r.allreduces_per_step == r.buckets


def test_step_times_are_summarized_by_median_and_iqr(ddp_accumulating):
    r = ddp_accumulating
    assert min(r.step_times) <= r.median_step_seconds <= max(r.step_times)
    assert 0 <= r.iqr_step_seconds <= max(r.step_times) - min(r.step_times)
    assert r.samples_per_second == pytest.approx(r.world_size * r.batch_size / r.median_step_seconds)


def test_without_no_sync_every_micro_batch_all_reduces(ddp_accumulating, ddp_accumulating_without_no_sync):
    # Same model, data and accumulation; only the communication differs: accumulation_steps times the
    # all-reduces, and the parameters are still identical on every rank (the gradients sum the same).
    on, off = ddp_accumulating, ddp_accumulating_without_no_sync
    assert on.no_sync and not off.no_sync and "no_sync off" in repr(off)
    assert off.params_identical and off.buckets == on.buckets
    assert off.allreduce_calls == off.backward_passes * off.buckets == off.accumulation_steps * on.allreduce_calls
    assert off.allreduces_per_step == off.accumulation_steps * off.buckets


def test_the_progress_bar_counts_the_steps_rank_0_finished(monkeypatch):
    import io

    from tqdm import tqdm

    bars = []

    def recording_bar(enabled, total, desc):
        assert enabled
        bars.append(tqdm(total=total, desc=desc, file=io.StringIO()))
        return bars[-1]

    monkeypatch.setattr("tricks_lib.training.ddp.optional_progress_bar", recording_bar)
    launch_ddp(nproc=2, backend="gloo", steps=3, warmup_steps=1, batch_size=8, width=4, image_size=16,
               timeout=120, progress=True)  # fmt: skip
    assert [(b.total, b.n) for b in bars] == [(4, 4)]  # one warm-up step and three timed ones


def test_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress"):
        launch_ddp(progress=1)
