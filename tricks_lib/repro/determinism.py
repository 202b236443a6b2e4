"""Deterministic mode: deterministic algorithms and cuDNN flags for a block, and cuBLAS's workspace setting."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

# The two values of CUBLAS_WORKSPACE_CONFIG that make cuBLAS deterministic (CUDA >= 10.2); the
# first uses ~24 MiB more GPU memory, the second can be slower.
CUBLAS_DETERMINISTIC_CONFIGS = (":4096:8", ":16:8")
_CUBLAS_ENV_VAR = "CUBLAS_WORKSPACE_CONFIG"
# The deterministic() blocks open now, innermost last: (token, the flags before it). Blocks nest; one exited before a
# block opened inside it would otherwise restore its flags first, and the inner block's exit would then bring back
# the outer block's settings after both had ended (deterministic algorithms left on).
_OPEN_BLOCKS: list[tuple[object, DeterminismFlags]] = []


@dataclass(frozen=True)
class DeterminismFlags:
    """The process-wide settings that decide whether kernels are deterministic."""

    algorithms: bool  # torch.use_deterministic_algorithms: nondeterministic ops raise (or warn)
    warn_only: bool  # ... warn instead of raising
    cudnn_deterministic: bool  # cuDNN picks only deterministic convolution algorithms
    cudnn_benchmark: bool  # cuDNN autotunes per input shape (the pick may differ between runs)
    mkldnn_deterministic: bool | None  # oneDNN's deterministic switch (None: not in this build)
    cublas_workspace_config: str | None  # the environment variable; None when unset

    def __repr__(self) -> str:
        return (
            f"DeterminismFlags(algorithms={self.algorithms}, warn_only={self.warn_only}, "
            f"cudnn.deterministic={self.cudnn_deterministic}, cudnn.benchmark={self.cudnn_benchmark}, "
            f"mkldnn.deterministic={self.mkldnn_deterministic}, "
            f"CUBLAS_WORKSPACE_CONFIG={self.cublas_workspace_config!r})"
        )


def determinism_flags() -> DeterminismFlags:
    """Read the current determinism settings (changes nothing)."""
    return DeterminismFlags(
        algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        mkldnn_deterministic=_get_mkldnn_deterministic(),
        cublas_workspace_config=os.environ.get(_CUBLAS_ENV_VAR),
    )


def _get_mkldnn_deterministic() -> bool | None:
    value = getattr(torch.backends.mkldnn, "deterministic", None)
    return None if value is None else bool(value)


def _apply_flags(flags: DeterminismFlags) -> None:
    torch.use_deterministic_algorithms(flags.algorithms, warn_only=flags.warn_only)
    torch.backends.cudnn.deterministic = flags.cudnn_deterministic
    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    if flags.mkldnn_deterministic is not None:
        torch.backends.mkldnn.deterministic = flags.mkldnn_deterministic
    # CUBLAS_WORKSPACE_CONFIG is not applied here: see _ensure_cublas_workspace_config.


def _ensure_cublas_workspace_config() -> str | None:
    """Make sure cuBLAS runs with a deterministic workspace in this process; return the variable's value.

    cuBLAS (through PyTorch's handle pool) reads ``CUBLAS_WORKSPACE_CONFIG`` once, when the process
    makes its first cuBLAS call, while ``use_deterministic_algorithms`` checks the variable at every
    call. Setting it after CUDA work began would therefore pass PyTorch's check without changing the
    workspace. So: without CUDA the variable is irrelevant and left alone; with a deterministic value
    there is nothing to do; before CUDA is initialized it is set, for the rest of the process (it is
    never restored: cuBLAS may read it at any later call); after, it is too late and this raises.
    """
    value = os.environ.get(_CUBLAS_ENV_VAR)
    if not torch.cuda.is_available() or value in CUBLAS_DETERMINISTIC_CONFIGS:
        return value
    if torch.cuda.is_initialized():
        current = "unset" if value is None else f"{value!r}, not a deterministic value"
        raise RuntimeError(
            f"deterministic(): {_CUBLAS_ENV_VAR} is {current}, and CUDA is already initialized in this "
            "process. cuBLAS reads the variable once, at its first call, so setting it now would not make "
            f"its matmuls deterministic. Set it before torch initializes CUDA: "
            f"os.environ.setdefault({_CUBLAS_ENV_VAR!r}, {CUBLAS_DETERMINISTIC_CONFIGS[0]!r}) before "
            "`import torch` (e.g. in the notebook's setup cell), or "
            f"`export {_CUBLAS_ENV_VAR}={CUBLAS_DETERMINISTIC_CONFIGS[0]}` in the shell; "
            f"{CUBLAS_DETERMINISTIC_CONFIGS[1]!r} also works (less memory, possibly slower)"
        )
    os.environ[_CUBLAS_ENV_VAR] = CUBLAS_DETERMINISTIC_CONFIGS[0]
    return os.environ[_CUBLAS_ENV_VAR]


@contextlib.contextmanager
def deterministic(enabled: bool = True, *, warn_only: bool = False) -> Iterator[DeterminismFlags]:
    """Run a block with deterministic kernels on (or off), then restore the flags it switched.

    ``enabled=True`` sets ``torch.use_deterministic_algorithms(True, warn_only=warn_only)`` (ops
    without a deterministic implementation raise ``RuntimeError``, or warn with ``warn_only``),
    ``cudnn.deterministic = True``, ``cudnn.benchmark = False`` (autotuning may pick a different
    algorithm per run) and oneDNN's ``mkldnn.deterministic = True`` where the build has it.
    ``enabled=False`` turns the three switches off and leaves benchmark alone. On exit, normal or by
    exception, their previous values come back. Use as ``with deterministic() as flags:``;
    ``flags`` are the values in effect inside the block.

    ``CUBLAS_WORKSPACE_CONFIG`` (needed on CUDA) is different: cuBLAS reads it once per process, at
    its first call, so a value set for one block and removed afterwards would only satisfy PyTorch's
    check, not change cuBLAS. With CUDA available and the variable not holding ``:4096:8`` or
    ``:16:8``, ``enabled=True`` therefore either sets it to ``:4096:8`` for the rest of the process
    (when CUDA is not initialized yet, so no cuBLAS call can have happened; it is not restored on
    exit) or raises. Set it before torch initializes CUDA: in the shell, or with
    ``os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")`` before ``import torch``.
    Without CUDA the variable is irrelevant and left as it is. ``enabled=False`` never touches it.

    Raises:
        TypeError: ``enabled`` or ``warn_only`` is not a bool.
        RuntimeError: ``enabled=True``, CUDA is available and already initialized in this process,
            and ``CUBLAS_WORKSPACE_CONFIG`` does not hold a deterministic value (nothing is changed).
    """
    if not isinstance(enabled, bool) or not isinstance(warn_only, bool):
        raise TypeError("enabled and warn_only must be bools: deterministic(True, warn_only=False)")
    previous = determinism_flags()
    if enabled:
        target = DeterminismFlags(
            algorithms=True,
            warn_only=warn_only,
            cudnn_deterministic=True,
            cudnn_benchmark=False,
            mkldnn_deterministic=None if previous.mkldnn_deterministic is None else True,
            cublas_workspace_config=_ensure_cublas_workspace_config(),  # raises before anything changed
        )
    else:
        target = DeterminismFlags(
            algorithms=False,
            warn_only=False,
            cudnn_deterministic=False,
            cudnn_benchmark=previous.cudnn_benchmark,
            mkldnn_deterministic=None if previous.mkldnn_deterministic is None else False,
            cublas_workspace_config=previous.cublas_workspace_config,
        )
    token = object()
    _OPEN_BLOCKS.append((token, previous))
    try:
        _apply_flags(target)
        yield target
    finally:
        _close_block(token)


def _close_block(token: object) -> None:
    """Restore the flags from before the block ``token``; refuse an exit out of order (after setting what was
    there before the block and every block opened inside it, whose own exits then change nothing)."""
    index = next((i for i, (t, _) in enumerate(_OPEN_BLOCKS) if t is token), None)
    if index is None:  # closed already, by an outer block exited out of order
        return
    previous = _OPEN_BLOCKS[index][1]
    inner = len(_OPEN_BLOCKS) - index - 1
    del _OPEN_BLOCKS[index:]
    _apply_flags(previous)
    if inner:
        raise RuntimeError(
            f"a deterministic() block was exited while {inner} block(s) opened inside it were still open: the flags "
            "from before it are back; nest the blocks (with ...: with ...:) so that each exits after those inside it"
        )
