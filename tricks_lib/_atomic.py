"""Atomic file writes: write under a temporary name, make it durable, rename on success.

An interrupted write (exception, Ctrl-C, killed process, full disk) leaves no file under the final
name: the temporary file is removed on exceptions, and a killed process leaves only a hidden
``.<name>.tmp-<pid>`` file that no reader opens and that the next process writing into that folder
removes.
``os.replace`` is atomic on POSIX when source and target are on the same file system, which is why
the temporary file lives in the target's own directory. The file is fsynced before the rename (so a
crash cannot leave the new name pointing at unwritten blocks) and the directory after it (so the
rename itself survives a crash).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
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


# Folders this process has already cleaned: once per folder, not once per file, since a writer of a
# folder of images writes thousands of files into it and each scan lists the whole folder.
_cleaned_folders: set[tuple[int, Path]] = set()
_TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove the ``.<name>.tmp-<pid>`` files that killed earlier writes (dead processes) left in ``folder``."""
    key = (os.getpid(), folder.resolve())
    if key in _cleaned_folders:
        return
    for candidate in folder.iterdir():
        match = _TEMPORARY.fullmatch(candidate.name)
        if match and int(match[1]) != os.getpid() and not _pid_alive(int(match[1])):
            with contextlib.suppress(FileNotFoundError):
                if candidate.is_dir():
                    shutil.rmtree(candidate)
                else:
                    candidate.unlink()
    _cleaned_folders.add(key)


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
    _remove_stale_temporaries(final.parent)
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
