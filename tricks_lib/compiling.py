"""What ``torch.compile`` costs the first time, measured honestly.

Inductor keeps compiled kernels and graphs in an on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), so the
second run of a notebook compiles in a fraction of the first run's time. A reader's first run is
the cold one; ``compile_cost`` times both on purpose, the cold one against an empty cache folder.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from tricks_lib.bench import format_seconds, time_first_call

__all__ = ["CompileCost", "compile_cost", "fresh_compile_cache"]

_CACHE_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"


@contextlib.contextmanager
def fresh_compile_cache() -> Iterator[None]:
    """Inside the block, ``torch.compile`` starts from empty caches: in memory and on disk.

    The previous cache folder setting is restored on exit. The fresh folder is kept until the
    process ends (compiled kernels inside it may still be loaded lazily, e.g. at the first backward).
    """
    previous = os.environ.get(_CACHE_ENV_VAR)
    folder = tempfile.mkdtemp(prefix="tricks-inductor-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[_CACHE_ENV_VAR] = folder
    torch._dynamo.reset()  # forget graphs compiled earlier in this process
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_CACHE_ENV_VAR, None)
        else:
            os.environ[_CACHE_ENV_VAR] = previous


@dataclass(frozen=True)
class CompileCost:
    """Seconds of the first call of a compiled function, from empty caches and from warm ones."""

    cold_seconds: float  # empty caches: a reader's first run
    warm_seconds: float  # graphs forgotten, on-disk cache kept: a rerun of the notebook

    def calls_to_pay_off(self, eager_seconds: float, compiled_seconds: float) -> float | None:
        """Calls after which the cold compile is paid back; None when compiled is not faster."""
        saved = eager_seconds - compiled_seconds
        return self.cold_seconds / saved if saved > 0 else None

    def __repr__(self) -> str:
        return (
            f"CompileCost(first call with empty caches {format_seconds(self.cold_seconds)}, "
            f"with a warm on-disk cache {format_seconds(self.warm_seconds)})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"


def compile_cost(
    make_compiled: Callable[[], Callable[[], object]],
    *,
    device: str | torch.device | None = None,
) -> tuple[Callable[[], object], CompileCost]:
    """Time the first call of a compiled function twice: from empty caches, then from a warm disk cache.

    Args:
        make_compiled: builds the zero-argument callable to time, e.g.
            ``lambda: (lambda f=torch.compile(fn): f(x))``; called twice, once per measurement.
        device: whose queue is synchronized around each first call (default ``pick_device()``).

    Returns:
        The callable built for the warm measurement (already compiled, ready for ``compare``) and
        the ``CompileCost``.

    Raises:
        TypeError: ``make_compiled`` is not callable or does not return a callable.
        Whatever ``torch.compile`` raises where it cannot run (no C++ compiler, unsupported platform).
    """
    if not callable(make_compiled):
        raise TypeError("make_compiled must be a function that returns the compiled zero-argument callable")
    with fresh_compile_cache():
        cold_fn = make_compiled()
        if not callable(cold_fn):
            raise TypeError(f"make_compiled() must return a callable, got {type(cold_fn).__name__}")
        cold = time_first_call(cold_fn, device=device)
        folder = os.environ[_CACHE_ENV_VAR]
        # Same on-disk cache, graphs forgotten in memory: what the next run of the notebook pays.
        torch._dynamo.reset()
        os.environ[_CACHE_ENV_VAR] = folder
        warm_fn = make_compiled()
        warm = time_first_call(warm_fn, device=device)
    return warm_fn, CompileCost(cold_seconds=cold, warm_seconds=warm)
