"""tricks_lib.profiling.profiler: the jitter dataset, py-spy sampling, argument errors."""

import re
import subprocess
import sys
import time

import pytest
import torch

from tricks_lib.profiling.profiler import (
    JITTER_SCRIPT,
    PixelJitterDataset,
    py_spy_sample,
    read_jitter_forever,
    without_local_paths,
)


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
