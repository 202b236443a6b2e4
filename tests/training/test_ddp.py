"""Tests for tricks_lib.training.ddp and ddp_worker: a real 2-process gloo run launched with torchrun through
sys.executable (the tests marked slow), and the launcher's refusals, its port and the result's numbers (fast)."""

import json
import socket
from pathlib import Path

import pytest
import torch

from tricks_lib.measurements import Measurement
from tricks_lib.training.ddp import DDPResult, free_port, launch_ddp
from tricks_lib.training.ddp_worker import _parse_args, _write_result


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


@pytest.mark.slow
def test_two_gloo_ranks_end_with_identical_parameters(ddp_accumulating):
    r = ddp_accumulating
    assert (r.world_size, r.backend, r.device, r.accumulation_steps) == (2, "gloo", "cpu", 2)
    # The ranks start from different seeds and see different data: equality is DDP's doing.
    assert r.params_identical and r.max_param_difference == 0.0
    assert r.num_parameters > 0 and len(r.step_times) == 3
    assert r.samples_per_second > 0 and r.final_loss > 0


@pytest.mark.slow
def test_result_converts_to_a_measurement(ddp_accumulating):
    m = ddp_accumulating.as_measurement()
    assert isinstance(m, Measurement)
    assert m.times == ddp_accumulating.step_times and m.items == 2 * 8
    assert "identical" in repr(ddp_accumulating)


@pytest.mark.slow
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


def test_free_port_can_be_listened_on_and_is_never_a_port_in_use():
    held, ports = [], []
    try:
        for _ in range(3):
            port = free_port()
            # The OS never hands out a port that a socket holds: not the ports taken just before.
            assert port not in ports
            ports.append(port)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", port))  # free right after the call: torchrun's rendezvous can listen on it
            sock.listen()
    finally:
        for sock in held:
            sock.close()
    # The OS picked it: a port of the kernel's ephemeral range, not a fixed or guessed number.
    port_range = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if port_range.exists():
        low, high = map(int, port_range.read_text().split())
        assert all(low <= port <= high for port in ports), (ports, low, high)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for nccl")
def test_two_nccl_ranks_end_with_identical_parameters():
    r = launch_ddp(nproc=2, backend="nccl", steps=3, batch_size=8, width=4, image_size=16, timeout=180)
    assert (r.backend, r.device) == ("nccl", "cuda") and r.params_identical


@pytest.mark.slow
def test_no_sync_skips_the_allreduce_of_all_but_the_last_micro_batch(ddp_accumulating):
    # A comm hook counts DDP's all-reduces: one per bucket on each synchronizing backward. Without
    # no_sync() every micro-batch would all-reduce (accumulation_steps times as many calls).
    r = ddp_accumulating
    assert r.buckets >= 1 and r.backward_passes == r.steps * r.accumulation_steps
    assert r.allreduce_calls == r.steps * r.buckets
    assert r.allreduce_calls < r.backward_passes * r.buckets
    assert r.allreduces_per_step == r.buckets


STEP_TIMES = [0.05, 0.01, 0.09, 0.02, 0.03]  # seconds, out of order: sorted 10, 20, 30, 50, 90 ms (mean 40)


def test_rank_0_writes_the_result_of_known_step_times(tmp_path):
    # Rank 0's result from fixed step times, parameters and all-reduces, without launching anything:
    # median 30 ms, so 2 ranks x 8 samples / 0.03 s = 533.3 samples/s; the second rank's parameters differ.
    out = tmp_path / "result.json"
    args = _parse_args([f"--out={out}", "--steps=5", "--warmup-steps=1", "--batch-size=8", "--accumulation-steps=2"])
    flat = torch.tensor([1.0, 2.0, 3.0])
    parameters = (flat, [flat, torch.tensor([1.0, 2.5, 3.0])])
    loss = torch.tensor(3.0)  # summed over the 2 ranks
    _write_result(args, "gloo", torch.device("cpu"), STEP_TIMES, loss, parameters, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    data = json.loads(out.read_text())
    assert data["samples_per_second"] == pytest.approx(16 / 0.03)
    assert (data["world_size"], data["batch_size"], data["steps"], data["backward_passes"]) == (2, 8, 5, 10)
    assert data["final_loss"] == pytest.approx(1.5) and data["num_parameters"] == 3
    assert not data["params_identical"] and data["max_param_difference"] == pytest.approx(0.5)
    assert (data["allreduce_calls"], data["buckets"], data["no_sync"]) == (10, 2, True)
    assert data["step_times"] == STEP_TIMES and not list(tmp_path.glob("*.tmp"))  # renamed into place


def test_step_times_are_summarized_by_median_and_iqr():
    r = DDPResult(
        world_size=2, backend="gloo", device="cpu", batch_size=8, accumulation_steps=2, steps=5,
        step_times=tuple(STEP_TIMES), samples_per_second=16 / 0.03, final_loss=1.0, num_parameters=3,
        params_identical=True, max_param_difference=0.0, threads_per_process=1, allreduce_calls=10, buckets=2,
        backward_passes=10,
    )  # fmt: skip
    # By hand: sorted 10, 20, 30, 50, 90 ms; median 30 ms; quartiles (linear) 20 and 50 ms, so an IQR of 30 ms.
    assert r.median_step_seconds == pytest.approx(0.03) and r.iqr_step_seconds == pytest.approx(0.03)
    assert r.seconds == pytest.approx(0.2) and r.allreduces_per_step == 2
    (row,) = r.summary_rows()
    assert (row.median_s, row.iqr_s, row.items_per_second) == pytest.approx((0.03, 0.03, 16 / 0.03))
    m = r.as_measurement()
    assert (m.median, m.iqr, m.items, m.items_per_second) == pytest.approx((0.03, 0.03, 16, 16 / 0.03))
    assert "step 30 ms (IQR 30 ms)" in repr(r) and "533 samples/s" in repr(r)


@pytest.mark.slow
def test_without_no_sync_every_micro_batch_all_reduces(ddp_accumulating, ddp_accumulating_without_no_sync):
    # Same model, data and accumulation; only the communication differs: accumulation_steps times the
    # all-reduces, and the parameters are still identical on every rank (the gradients sum the same).
    on, off = ddp_accumulating, ddp_accumulating_without_no_sync
    assert on.no_sync and not off.no_sync and "no_sync off" in repr(off)
    assert off.params_identical and off.buckets == on.buckets
    assert off.allreduce_calls == off.backward_passes * off.buckets == off.accumulation_steps * on.allreduce_calls
    assert off.allreduces_per_step == off.accumulation_steps * off.buckets


@pytest.mark.slow
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
