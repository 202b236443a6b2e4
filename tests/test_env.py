"""tricks_lib.env: quick mode, device choice, the environment description."""

import pytest
import torch

from tricks_lib.env import EnvInfo, describe, is_colab, pick_device, quick_mode, size_for_mode


def test_quick_mode_reads_the_variable(monkeypatch):
    monkeypatch.setenv("TRICKS_QUICK", "1")
    assert quick_mode() and size_for_mode(quick=1, full=2) == 1
    monkeypatch.setenv("TRICKS_QUICK", "0")
    assert not quick_mode() and size_for_mode(quick=1, full=2) == 2
    monkeypatch.delenv("TRICKS_QUICK")
    assert not quick_mode()
    monkeypatch.setenv("TRICKS_QUICK", "maybe")
    with pytest.raises(ValueError, match="TRICKS_QUICK"):
        quick_mode()


def test_full_mode_sizes_work_for_the_device(monkeypatch):
    import tricks_lib.env as env

    monkeypatch.setenv("TRICKS_QUICK", "0")
    monkeypatch.setattr(env, "pick_device", lambda: torch.device("cuda"))  # a GPU machine, without a GPU here
    assert size_for_mode(quick=32, full=128, cuda=512) == 512 and size_for_mode(quick=32, full=128) == 128
    monkeypatch.setattr(env, "pick_device", lambda: torch.device("cpu"))
    assert size_for_mode(quick=32, full=128, cuda=512) == 128  # the CPU's sizes are unchanged
    monkeypatch.setenv("TRICKS_QUICK", "1")
    monkeypatch.setattr(env, "pick_device", lambda: torch.device("cuda"))
    assert size_for_mode(quick=32, full=128, cuda=512) == 32  # quick mode stays quick everywhere


def test_pick_device(monkeypatch):
    monkeypatch.delenv("TRICKS_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device().type == expected
    assert pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("TRICKS_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    with pytest.raises(TypeError):
        pick_device(3)
    with pytest.raises(ValueError, match="not a device name"):
        pick_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_pick_device_cuda_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="no usable CUDA"):
        pick_device("cuda")


def test_describe():
    info = describe()
    assert isinstance(info, EnvInfo)
    assert info.torch == torch.__version__
    assert info.num_threads == torch.get_num_threads()
    assert info.cuda_available == torch.cuda.is_available()
    if not info.cuda_available:
        assert info.compute_capability is None and not info.tf32_native
        assert info.bf16_native == info.cpu_bf16_native
    else:
        assert info.bf16_native == (info.compute_capability >= (8, 0))
    line = info.summary()
    assert torch.__version__ in line and "threads" in line
    assert set(info.to_dict()) >= {"cpu_flags", "bf16_native", "tf32_native", "os"}
    assert "<table>" in info._repr_html_()
    assert is_colab() is False


@pytest.mark.slow  # starts fresh Python processes
def test_import_changes_no_global_state():
    import subprocess
    import sys

    code = (
        "import torch, random; s = torch.initial_seed(); r = random.getstate(); "
        "d = torch.are_deterministic_algorithms_enabled(); b = torch.backends.cudnn.benchmark; "
        "import matplotlib; rc = dict(matplotlib.rcParams); "
        "import tricks_lib, tricks_lib.report.runner; "
        "assert torch.initial_seed() == s and random.getstate() == r; "
        "assert torch.are_deterministic_algorithms_enabled() == d and torch.backends.cudnn.benchmark == b; "
        "assert dict(matplotlib.rcParams) == rc; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
