"""What machine is this? Device choice, an environment description, and quick mode.

Every number a notebook prints is read against the machine that produced it, so each notebook's
first output is `describe()`. Nothing here changes global state: it only reads.
"""

from __future__ import annotations

import html
import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch

__all__ = [
    "EnvInfo",
    "describe",
    "is_colab",
    "pick_device",
    "quick_mode",
    "size_for_mode",
]

QUICK_ENV_VAR = "TRICKS_QUICK"
DEVICE_ENV_VAR = "TRICKS_DEVICE"

# CPU instruction-set extensions that decide whether low-precision CPU tricks can pay off:
# avx512_bf16 / amx_bf16 give native bf16 matmuls, avx512_vnni / amx_int8 native int8.
_INTERESTING_CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

T = TypeVar("T")


def quick_mode() -> bool:
    """True when the environment variable ``TRICKS_QUICK`` asks for quick mode.

    Quick mode shrinks sizes so the whole suite runs in minutes on 2 cores (CI and the tests set it);
    full mode gives meaningful numbers.

    Raises:
        ValueError: the variable holds something other than 1/0/true/false/yes/no/on/off.
    """
    raw = os.environ.get(QUICK_ENV_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(
        f"{QUICK_ENV_VAR}={raw!r} is not understood: set it to 1 for quick mode or 0 (or unset it) for full mode."
    )


def size_for_mode(quick: T, full: T, *, cuda: T | None = None) -> T:
    """Return ``quick`` in quick mode and ``full`` otherwise: ``N = size_for_mode(quick=64, full=4096)``.

    ``cuda``: the full-mode size when the notebooks run on a CUDA device (``pick_device()``), where the CPU's size
    would leave the GPU idle and every verdict read launch overhead: ``size_for_mode(quick=32, full=128, cuda=512)``.
    """
    if quick_mode():
        return quick
    if cuda is not None and pick_device().type == "cuda":
        return cuda
    return full


def is_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules


def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device the notebooks run on: CUDA when available, else the CPU.

    ``prefer`` (or the environment variable ``TRICKS_DEVICE``, e.g. ``cpu`` to keep a GPU machine on
    its CPU) chooses explicitly.

    Raises:
        TypeError: ``prefer`` is not a string or a torch.device.
        ValueError: the preferred device does not exist on this machine.
    """
    if prefer is None:
        prefer = os.environ.get(DEVICE_ENV_VAR) or None
    if prefer is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(prefer, (str, torch.device)):
        raise TypeError(f"prefer must be a device name like 'cpu' or 'cuda', got {type(prefer).__name__}")
    try:
        device = torch.device(prefer)
    except RuntimeError as err:
        raise ValueError(f"{prefer!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{prefer!r} was asked for but this machine has no usable CUDA device; use 'cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{prefer!r} was asked for but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif device.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"{prefer!r} was asked for but MPS is not available here; use 'cpu'")
    elif device.type != "cpu":
        raise ValueError(f"device type {device.type!r} is not supported here; use 'cpu' or 'cuda'")
    return device


@dataclass(frozen=True)
class EnvInfo:
    """A description of the machine and software that produced a set of numbers."""

    python: str
    torch: str
    torchvision: str | None
    os: str
    cpu_model: str
    cpu_capability: str  # what ATen dispatches CPU kernels to (e.g. AVX512, AVX2)
    cpu_flags: tuple[str, ...]  # the interesting ISA extensions present
    cpu_bf16_native: bool  # avx512_bf16 or amx_bf16
    num_threads: int  # torch intra-op threads
    logical_cpus: int
    cuda_available: bool
    device_name: str  # the GPU's name, or the CPU model when there is no GPU
    cuda_version: str | None
    compute_capability: tuple[int, int] | None
    gpu_count: int
    gpu_memory_bytes: int | None
    bf16_native: bool  # native bf16 on the default device (CUDA: cc >= 8.0; CPU: ISA flags)
    tf32_native: bool  # TF32 tensor cores: CUDA cc >= 8.0 only
    fp16_tensor_cores: bool  # fp16 tensor cores: CUDA cc >= 7.0 (Volta on); the CPU has none
    colab: bool
    quick_mode: bool

    def summary(self) -> str:
        """One line naming the machine: device, torch version, threads, mode."""
        if self.cuda_available:
            cc = ".".join(map(str, self.compute_capability or ()))
            dev = f"{self.device_name} (sm {cc}, x{self.gpu_count})"
        else:
            dev = f"CPU only: {self.cpu_model}"
        mode = "quick mode" if self.quick_mode else "full mode"
        return (
            f"{dev} | torch {self.torch} | {self.num_threads} threads of {self.logical_cpus} CPUs "
            f"| bf16 native: {'yes' if self.bf16_native else 'no'} | {mode}"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def __repr__(self) -> str:
        return f"EnvInfo({self.summary()})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
            f"{html.escape(_format_field(v))}</td></tr>"
            for k, v in self.to_dict().items()
        )
        return f"<p><b>{html.escape(self.summary())}</b></p><table>{rows}</table>"


def _format_field(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) or "-"
    if value is None:
        return "-"
    return str(value)


def _read_cpuinfo() -> tuple[str, set[str]]:
    """CPU model name and ISA flags from /proc/cpuinfo (Linux); best effort elsewhere."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def describe() -> EnvInfo:
    """Describe this machine: versions, devices, native low-precision support, CPU, threads, OS.

    "Native" bf16 on CUDA means compute capability >= 8.0: a T4 (7.5) reports bf16 as supported
    through emulation (``torch.cuda.is_bf16_supported()`` is True there), which is slow.
    """
    try:
        import torchvision

        tv_version: str | None = torchvision.__version__
    except Exception:  # torchvision is optional for describe(); a broken install must not hide the rest
        tv_version = None
    cpu_model, flags = _read_cpuinfo()
    present = tuple(f for f in _INTERESTING_CPU_FLAGS if f in flags)
    cpu_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        capability = "unknown"

    cuda = torch.cuda.is_available()
    cc = torch.cuda.get_device_capability(0) if cuda else None
    native_ampere = cc is not None and cc >= (8, 0)
    return EnvInfo(
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=tv_version,
        os=f"{platform.system()} {platform.release()}",
        cpu_model=cpu_model,
        cpu_capability=capability,
        cpu_flags=present,
        cpu_bf16_native=cpu_bf16,
        num_threads=torch.get_num_threads(),
        logical_cpus=os.cpu_count() or 1,
        cuda_available=cuda,
        device_name=torch.cuda.get_device_name(0) if cuda else cpu_model,
        cuda_version=torch.version.cuda if cuda else None,
        compute_capability=cc,
        gpu_count=torch.cuda.device_count() if cuda else 0,
        gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory if cuda else None,
        bf16_native=native_ampere if cuda else cpu_bf16,
        tf32_native=native_ampere,
        fp16_tensor_cores=cc is not None and cc >= (7, 0),
        colab=is_colab(),
        quick_mode=quick_mode(),
    )
