"""The device logic that decides GPU paths, checked on a CPU with the CUDA queries mocked.

A T4 (sm_75) has fp16 tensor cores but neither native bf16 nor TF32; an A100 (sm_80) and an H100
(sm_90) have all three. The notebooks choose their autocast dtype and their skips from these
answers, so a wrong one would take a GPU reader down a slow or failing path that no CPU run shows.
"""

from types import SimpleNamespace

import pytest
import torch

from tricks_lib import env
from tricks_lib.training.steps import autocast_dtype

GPUS = {
    # name: (compute capability, memory bytes, fp16 tensor cores, bf16 native, tf32)
    "Tesla T4": ((7, 5), 15 * 2**30, True, False, False),
    "Tesla P100-PCIE-16GB": ((6, 0), 16 * 2**30, False, False, False),
    "NVIDIA A100-SXM4-40GB": ((8, 0), 40 * 2**30, True, True, True),
    "NVIDIA H100 80GB HBM3": ((9, 0), 80 * 2**30, True, True, True),
}


@pytest.fixture(params=sorted(GPUS))
def fake_gpu(request, monkeypatch):
    name = request.param
    cc, memory, *_ = GPUS[name]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=memory))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    return name


def test_describe_reads_each_gpus_capabilities(fake_gpu):
    cc, memory, fp16_tc, bf16, tf32 = GPUS[fake_gpu]
    info = env.describe()
    assert info.cuda_available and info.device_name == fake_gpu and info.compute_capability == cc
    assert (info.fp16_tensor_cores, info.bf16_native, info.tf32_native) == (fp16_tc, bf16, tf32)
    assert info.gpu_memory_bytes == memory and info.cuda_version == "12.4"
    summary = info.summary()
    assert fake_gpu in summary and f"bf16 native: {'yes' if bf16 else 'no'}" in summary


def test_autocast_dtype_is_fp16_before_ampere_and_bf16_from_it(fake_gpu):
    cc = GPUS[fake_gpu][0]
    assert autocast_dtype("cuda") == (torch.bfloat16 if cc >= (8, 0) else torch.float16)


def test_a_t4_is_not_taken_for_a_bf16_gpu_although_torch_says_bf16_is_supported(monkeypatch):
    # torch.cuda.is_bf16_supported() is True on a T4 (emulated); describe() must not take it as native.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=2**34))
    assert not env.describe().bf16_native


def test_the_cpu_has_no_tensor_cores():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU-only answer is checked on CPU machines")
    info = env.describe()
    assert not info.fp16_tensor_cores and not info.tf32_native and info.compute_capability is None
