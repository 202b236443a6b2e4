"""tricks_lib.profiling.profiler: step_split's timers on known durations, the jitter dataset, argument errors."""

import re
import subprocess
import sys
import time

import pytest
import torch

from tricks_lib.profiling.profiler import (
    JITTER_SCRIPT,
    PixelJitterDataset,
    StepSplit,
    py_spy_sample,
    read_jitter_forever,
    step_split,
    without_local_paths,
)
from tricks_lib.report.results import record

WAIT_S, STEP_S = 0.03, 0.01  # a loader that takes 30 ms per batch, a step that takes 10 ms
SHARE_TOLERANCE = 0.1  # sleeps overshoot on a busy machine: shares within 10 percentage points


def sleepy_loader(n, seconds=WAIT_S):
    for i in range(n):
        time.sleep(seconds)
        yield i


def test_step_split_measures_known_durations():
    seen = []
    split = step_split(sleepy_loader(6), lambda b: (time.sleep(STEP_S), seen.append(b)), steps=5, device="cpu")
    assert seen == [0, 1, 2, 3, 4, 5]  # one warm-up step, then five timed ones, in order
    assert split.steps == 5 and len(split.wait_times) == 5
    assert min(split.wait_times) >= WAIT_S and min(split.step_times) >= STEP_S  # sleep never ends early
    assert split.wait_share == pytest.approx(WAIT_S / (WAIT_S + STEP_S), abs=SHARE_TOLERANCE)
    assert split.step_share == pytest.approx(STEP_S / (WAIT_S + STEP_S), abs=SHARE_TOLERANCE)
    assert split.wait_s + split.step_s + split.other_s == pytest.approx(split.total_s)
    assert split.bound == "loader-bound"


def test_compute_bound_loop_reads_compute_bound():
    split = step_split(sleepy_loader(4, 0.0), lambda b: time.sleep(STEP_S), steps=3, warmup=0, device="cpu")
    assert split.bound == "compute-bound" and split.step_share > 0.8


def test_step_split_renders_and_records():
    split = step_split(sleepy_loader(3, 0.001), lambda b: None, steps=2, device="cpu", label="tiny loop")
    assert "tiny loop" in repr(split) and "waiting for the next batch" in split._repr_markdown_()
    assert "<table>" in split._repr_html_()
    rec = record("tiny loop split", split)
    assert rec.kind == StepSplit.record_kind == "step split"
    assert [row["variant"] for row in rec.summary] == [
        "tiny loop: waiting for the next batch",
        "tiny loop: in the step (synchronized)",
        "tiny loop: total",
    ]
    assert split.to_dict()["steps"] == 2


def test_step_split_says_when_the_loader_runs_out():
    with pytest.raises(ValueError, match="yielded 3 batches"):
        step_split(range(3), lambda b: None, steps=5, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"loader": 3}, TypeError),
        ({"step": "not callable"}, TypeError),
        ({"steps": 0}, ValueError),
        ({"steps": 2.0}, TypeError),
        ({"steps": True}, TypeError),
        ({"warmup": -1}, ValueError),
        ({"device": "tpu"}, ValueError),
        ({"label": ""}, TypeError),
    ],
)
def test_step_split_rejects_bad_arguments(kwargs, error):
    args = {"loader": range(10), "step": lambda b: None, "steps": 2, **kwargs}
    loader, step = args.pop("loader"), args.pop("step")
    with pytest.raises(error):
        step_split(loader, step, **args)


def test_step_split_result_checks_its_fields():
    with pytest.raises(ValueError):
        StepSplit("x", (), (), 1.0, "cpu")
    with pytest.raises(ValueError):
        StepSplit("x", (0.1,), (0.1,), 0.0, "cpu")


def test_pixel_jitter_python_loop_matches_tensor_op():
    images, labels = torch.rand(4, 3, 5, 5), torch.arange(4)
    slow = PixelJitterDataset(images, labels, std=0.5, python_loop=True)
    fast = PixelJitterDataset(images, labels, std=0.5, python_loop=False)
    for i in range(len(slow)):
        (a, la), (b, lb) = slow[i], fast[i]
        assert a.shape == (3, 5, 5) and a.dtype == torch.float32 and la == lb == i
        torch.testing.assert_close(a, b)  # same noise, float64 vs float32 additions: within float32 rounding
        assert 0.0 <= a.min() and a.max() <= 1.0
        assert not torch.equal(a, images[i])  # the jitter did something
    assert torch.equal(slow[2][0], slow[2][0])  # the same index gives the same sample every time
    assert not torch.equal(fast[1][0] - images[1], fast[2][0] - images[2])  # each index its own noise


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((torch.rand(2, 3, 4), torch.arange(2)), {}, TypeError),
        ((torch.rand(2, 1, 4, 4), torch.arange(3)), {}, ValueError),
        ((torch.rand(2, 1, 4, 4), torch.arange(2)), {"std": 0}, ValueError),
        ((torch.rand(2, 1, 4, 4), torch.arange(2)), {"python_loop": 1}, TypeError),
    ],
)
def test_pixel_jitter_rejects_bad_arguments(args, kwargs, error):
    with pytest.raises(error):
        PixelJitterDataset(*args, **kwargs)


@pytest.mark.parametrize(("kwargs", "error"), [({"samples": 0}, ValueError), ({"size": 2.0}, TypeError)])
def test_read_jitter_forever_rejects_bad_sizes(kwargs, error):
    with pytest.raises(error):
        read_jitter_forever(**kwargs)


@pytest.mark.slow
def test_jitter_script_says_ready_then_keeps_reading():
    child = subprocess.Popen([sys.executable, "-c", JITTER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)
        assert child.poll() is None  # still reading: it runs until killed
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_py_spy_sample_finds_the_python_loop_or_says_why_not():
    result = py_spy_sample(JITTER_SCRIPT, seconds=1, timeout=60)
    if result.ok:
        # The dump is one instant's stack: the loop is always on it; the dataset only when the instant fell
        # inside a read (CI once caught the 3% of time between reads), so the dataset is checked in the shares.
        # No absolute folders: a path starts at the package (py-spy's own "tricks_lib/profiling/..." form).
        assert "read_jitter_forever" in result.dump and not re.search(r"(?<![\w.+-])/\w+/", result.dump)
        assert any("PixelJitterDataset" in name for name in result.leaf_shares), result.leaf_shares
        assert 0 < len(result.leaf_shares) <= 4 and sum(result.leaf_shares.values()) <= 1.0 + 1e-9
        assert "profiler.py)" in next(iter(result.leaf_shares))  # the dataset's module leads
    else:  # no py-spy, or no ptrace permission here: the reason, not a hang or an exception
        assert result.error.startswith("py-spy") and not result.dump and not result.leaf_shares


@pytest.mark.slow
def test_py_spy_sample_gives_up_on_a_script_that_never_gets_ready(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: "py-spy")  # get past the installed check
    result = py_spy_sample("import time; time.sleep(60)", timeout=1)
    assert not result.ok and "did not get ready within 1 s" in result.error


def test_py_spy_sample_says_when_py_spy_is_missing(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    result = py_spy_sample("print('ready')")
    assert not result.ok and "not installed" in result.error and "failed" in repr(result)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"script": ""}, TypeError),
        ({"seconds": 0.5}, TypeError),
        ({"seconds": 0}, ValueError),
        ({"timeout": 0}, ValueError),
    ],
)
def test_py_spy_sample_rejects_bad_arguments(kwargs, error):
    args = {"script": "print('ready')", **kwargs}
    with pytest.raises(error):
        py_spy_sample(args.pop("script"), **args)


def test_without_local_paths_cuts_folders_and_colours():
    assert without_local_paths("\x1b[1mat /root/x/y/file.py:3\x1b[0m") == "at file.py:3"
    with pytest.raises(TypeError):
        without_local_paths(3)
