"""Atomic file writes: write under a temporary name, make it durable, rename on success.

An interrupted write (exception, Ctrl-C, killed process, full disk) leaves no file under the final
name: the temporary file is removed on exceptions, and a killed process leaves only a hidden
``.<name>.tmp-<pid>`` file that no reader opens and that the next write of the same name removes.
``os.replace`` is atomic on POSIX when source and target are on the same file system, which is why
the temporary file lives in the target's own directory. The file is fsynced before the rename (so a
crash cannot leave the new name pointing at unwritten blocks) and the directory after it (so the
rename itself survives a crash).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "fsync_path", "temporary_path_for", "write_bytes_atomic"]


def temporary_path_for(path: Path) -> Path:
    """Return a hidden temporary path in the same directory as ``path`` (same file system)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _remove_stale_temporaries(final: Path) -> None:
    """Remove ``.<name>.tmp-<pid>`` files that a killed earlier write of ``final`` left behind."""
    prefix = f".{final.name}.tmp-"
    for candidate in final.parent.glob(f"{prefix}*"):
        pid = candidate.name[len(prefix) :]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                if candidate.is_dir():
                    import shutil

                    shutil.rmtree(candidate)
                else:
                    candidate.unlink()


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write to; fsync it and rename it to ``path`` only if the block succeeds.

    Args:
        path: the final file name. Its parent directory must exist.
    Raises:
        FileNotFoundError: if the parent directory does not exist.
    """
    final = Path(path)
    if not final.parent.is_dir():
        raise FileNotFoundError(f"directory {final.parent} does not exist; create it first")
    _remove_stale_temporaries(final)
    tmp = temporary_path_for(final)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably; return the final path."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)
