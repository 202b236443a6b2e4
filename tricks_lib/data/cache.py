"""Make a cold page cache on demand, and check that it is cold.

``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` asks the kernel to drop a file's clean pages
from the page cache, without root (unlike ``echo 3 > /proc/sys/vm/drop_caches``). The kernel may
ignore the advice (dirty pages, tmpfs, other file systems), so residency is measured afterwards
with ``mincore(2)`` on a read-only mapping of each file. Where ``mincore`` is unavailable (not
Linux) the report says so instead of guessing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class CacheResidency:
    """How much of some files is in the page cache. ``resident_bytes`` is None when unmeasurable."""

    files: int
    total_bytes: int
    resident_bytes: int | None
    method: str  # "mincore" or "unavailable: <reason>"

    @property
    def fraction(self) -> float | None:
        if self.resident_bytes is None:
            return None
        return self.resident_bytes / self.total_bytes if self.total_bytes else 0.0

    def __repr__(self) -> str:
        frac = "unknown" if self.fraction is None else f"{self.fraction:.1%}"
        return f"CacheResidency({self.files} files, {self.total_bytes} bytes, {frac} resident)"


@dataclass(frozen=True)
class EvictionReport:
    """Residency before and after eviction; ``verified`` is True only if measured cold."""

    before: CacheResidency
    after: CacheResidency
    verified: bool

    def __repr__(self) -> str:
        f = lambda r: "unknown" if r.fraction is None else f"{r.fraction:.1%}"  # noqa: E731
        return (f"EvictionReport({self.after.files} files, resident {f(self.before)} -> "
                f"{f(self.after)}, verified={self.verified})")


def _files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file()))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} is neither a file nor a directory")
    return out


def _libc():
    if not hasattr(os, "posix_fadvise"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _resident_bytes(libc, path: Path) -> int:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            libc.munmap(addr, size)
    resident = np.frombuffer(vec.raw, dtype=np.uint8) & 1
    page_bytes = np.full(pages, mmap.PAGESIZE, dtype=np.int64)
    page_bytes[-1] = size - (pages - 1) * mmap.PAGESIZE
    return int((resident * page_bytes).sum())


def page_cache_residency(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> CacheResidency:
    """Measure how many bytes of ``paths`` (files, or directories searched recursively) are cached.

    Raises:
        FileNotFoundError: if a path does not exist.
    """
    files = _files(paths)
    total = sum(p.stat().st_size for p in files)
    libc = _libc()
    if libc is None:
        return CacheResidency(len(files), total, None, "unavailable: no posix_fadvise/mincore here")
    try:
        resident = sum(_resident_bytes(libc, p) for p in files)
    except OSError as e:
        return CacheResidency(len(files), total, None, f"unavailable: {e.strerror or e}")
    return CacheResidency(len(files), total, resident, "mincore")


def drop_from_page_cache(paths: str | os.PathLike | Iterable[str | os.PathLike], *,
                         flush: bool = False) -> int:
    """Advise the kernel to drop ``paths`` from the page cache, without measuring.

    Cheap (a few microseconds per file) unless ``flush``: dirty pages (recently written data)
    cannot be dropped until written back, and ``flush=True`` writes them back with ``fdatasync``,
    which costs a disk cache flush per file (milliseconds). Flush once after writing (as
    :func:`evict_from_page_cache` does), then drop cheaply before every cold read; reading never
    dirties pages. Returns the number of files advised (0 where ``posix_fadvise`` does not exist).

    Raises:
        FileNotFoundError: if a path does not exist.
    """
    files = _files(paths)
    if not hasattr(os, "posix_fadvise"):
        return 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            if flush:
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(files)


def evict_from_page_cache(paths: str | os.PathLike | Iterable[str | os.PathLike], *,
                          tolerance: float = 0.01) -> EvictionReport:
    """Write back and drop ``paths`` from the page cache, then measure residency (``mincore``).

    Args:
        paths: files, or directories (all files below them).
        tolerance: largest resident fraction after eviction that still counts as cold.
    Returns:
        An :class:`EvictionReport`; ``verified`` is False when eviction could not be measured or
        left more than ``tolerance`` of the bytes cached (e.g. on tmpfs).
    Raises:
        FileNotFoundError: if a path does not exist.
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    before = page_cache_residency(paths)
    drop_from_page_cache(paths, flush=True)
    after = page_cache_residency(paths)
    verified = after.fraction is not None and after.fraction <= tolerance
    return EvictionReport(before, after, verified)
