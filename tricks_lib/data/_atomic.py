"""Atomic file writes: write under a temporary name, rename on success.

An interrupted write (exception, Ctrl-C, killed process) leaves no file under the final name: the
temporary file is removed on exceptions, and a killed process leaves only a hidden ``.<name>.tmp-*``
file that no reader opens. ``os.replace`` is atomic on POSIX when source and target are on the same
file system, which is why the temporary file lives in the target's own directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def temporary_path_for(path: Path) -> Path:
    """Return a hidden temporary path in the same directory as ``path`` (same file system)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write to; rename it to ``path`` only if the block succeeds.

    Args:
        path: the final file name. Its parent directory must exist.
    Raises:
        FileNotFoundError: if the parent directory does not exist.
    """
    final = Path(path)
    if not final.parent.is_dir():
        raise FileNotFoundError(f"directory {final.parent} does not exist; create it first")
    tmp = temporary_path_for(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and return the final path."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)
