"""Faster ``malloc`` implementations for ``LD_PRELOAD``: where they are installed, and whether a process mapped them.

- ``find_shared_library(filename)``: the path of a library such as ``libjemalloc.so.2``, or None.
- ``allocator_environments()``: glibc plus every allocator of ``ALLOCATORS`` found here (``LD_PRELOAD``),
  and the install line of each one missing; ``loaded_allocators(environments)``: which of them each
  environment's process really mapped (read in a fresh process per environment, module ``env_workers``).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tricks_lib.inference.env_workers import evaluate_in_environments

__all__ = ["ALLOCATORS", "allocator_environments", "find_shared_library", "loaded_allocators"]

# name -> (shared library, the Debian/Ubuntu package that installs it)
ALLOCATORS = {
    "jemalloc": ("libjemalloc.so.2", "apt-get install -y libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "apt-get install -y libtcmalloc-minimal4"),
}
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def find_shared_library(filename: str) -> str | None:
    """The path of shared library ``filename`` (e.g. ``"libjemalloc.so.2"``) in the usual folders, or None."""
    if not isinstance(filename, str) or not filename:
        raise TypeError(f"filename must be a library file name such as 'libjemalloc.so.2', got {filename!r}")
    for folder in _LIBRARY_DIRS:
        path = Path(folder) / filename
        if path.exists():
            return str(path)
    return None


def allocator_environments() -> tuple[dict[str, dict[str, str | None]], dict[str, str]]:
    """Environments for an allocator comparison, and the allocators missing here.

    Returns:
        (environments, missing): environments maps ``"glibc malloc"`` to ``{"LD_PRELOAD": None}`` (unset)
        and each allocator of ``ALLOCATORS`` found on this machine to ``{"LD_PRELOAD": its path}``;
        missing maps each allocator not found to the command that installs it.
    """
    environments: dict[str, dict[str, str | None]] = {"glibc malloc": {"LD_PRELOAD": None}}
    missing = {}
    for name, (library, install) in ALLOCATORS.items():
        path = find_shared_library(library)
        if path is None:
            missing[name] = install
        else:
            environments[name] = {"LD_PRELOAD": path}
    return environments, missing


def loaded_allocators(
    environments: Mapping[str, Mapping[str, str | None]], *, timeout: float = 300.0
) -> dict[str, tuple[str, ...]]:
    """Which allocators of ``ALLOCATORS`` are mapped in a fresh process of each environment.

    An ``LD_PRELOAD`` that names a missing file, or that the dynamic loader refuses, leaves glibc's
    ``malloc`` in place without an error: this reads ``/proc/self/maps`` in the process to see.

    Returns:
        environment name -> the names of the allocators mapped there (empty: glibc's own).

    Raises:
        TypeError: a malformed ``environments``.
        RuntimeError: a process failed.
    """
    names = tuple(ALLOCATORS)
    seen = evaluate_in_environments(f"tuple(n for n in {names!r} if preloaded(n))", environments, timeout=timeout)
    return {env: tuple(ast.literal_eval(value)) for env, value in seen.items()}
