"""Page-cache control for cold reads, and the memory a RAM cache costs per DataLoader worker.

Page cache: ``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` asks the kernel to drop a file's
clean pages from the page cache, without root (unlike ``echo 3 > /proc/sys/vm/drop_caches``). The
kernel may ignore the advice (dirty pages, tmpfs, other file systems), so residency is measured
afterwards with ``mincore(2)`` on a read-only mapping of each file. Where ``mincore`` is unavailable
(not Linux) the report says so instead of guessing.

Worker memory: a dataset that holds decoded samples in RAM is inherited copy-on-write by workers
started with ``fork`` (shared until written), but pickled into every worker started with ``spawn``
or ``forkserver``. ``process_memory`` reads a process's private memory (USS: pages no other process
maps) from ``/proc/<pid>/smaps_rollup``; ``loader_worker_memory`` runs one epoch of a dataset in a
DataLoader worker with a chosen start method and returns that worker's memory.
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
import torch

from tricks_lib._validate import check_positive

__all__ = [
    "CacheResidency",
    "EvictionReport",
    "ProcessMemory",
    "drop_from_page_cache",
    "evict_from_page_cache",
    "loader_worker_memory",
    "page_cache_residency",
    "process_memory",
]


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
        return (
            f"EvictionReport({self.after.files} files, resident {f(self.before)} -> "
            f"{f(self.after)}, verified={self.verified})"
        )


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
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
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


def drop_from_page_cache(paths: str | os.PathLike | Iterable[str | os.PathLike], *, flush: bool = False) -> int:
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


def evict_from_page_cache(
    paths: str | os.PathLike | Iterable[str | os.PathLike], *, tolerance: float = 0.01
) -> EvictionReport:
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


# /proc/<pid>/smaps_rollup (Linux 4.14+) sums /proc/<pid>/smaps over all mappings, in kB.
_SMAPS_FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")
START_METHODS = ("fork", "forkserver", "spawn")


@dataclass(frozen=True)
class ProcessMemory:
    """A process's resident memory, from ``/proc/<pid>/smaps_rollup``; byte fields are None when unmeasurable.

    ``private_bytes`` is the USS (unique set size, Private_Clean + Private_Dirty): what the system
    would get back if the process exited. ``shared_bytes`` are resident pages it shares with other
    processes (copy-on-write pages after ``fork``, shared memory, shared libraries).
    """

    pid: int
    rss_bytes: int | None
    pss_bytes: int | None
    private_bytes: int | None
    shared_bytes: int | None
    method: str  # "smaps_rollup" or "unavailable: <reason>"

    @property
    def available(self) -> bool:
        return self.private_bytes is not None

    def __repr__(self) -> str:
        if not self.available:
            return f"ProcessMemory(pid {self.pid}, {self.method})"
        mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
        return (
            f"ProcessMemory(pid {self.pid}, private {mib(self.private_bytes)}, "
            f"shared {mib(self.shared_bytes)}, rss {mib(self.rss_bytes)})"
        )


def _check_pid(pid: object) -> int:
    check_positive(pid, "pid", allow_none=False, integer=True)
    return pid


def process_memory(pid: int | None = None, *, proc: str | os.PathLike = "/proc") -> ProcessMemory:
    """Read the memory of process ``pid`` (default: this process) from ``<proc>/<pid>/smaps_rollup``.

    Args:
        pid: a process id; None for the calling process.
        proc: where procfs is mounted (a parameter so tests can point it elsewhere).
    Returns:
        A :class:`ProcessMemory`. Where ``smaps_rollup`` does not exist (not Linux, Linux before 4.14,
        no procfs) or cannot be read, its byte fields are None and ``method`` says why.
    Raises:
        TypeError / ValueError: ``pid`` is not a positive int.
        ProcessLookupError: procfs works here but there is no process ``pid``.
    """
    pid = os.getpid() if pid is None else _check_pid(pid)
    root = Path(proc)
    path = root / str(pid) / "smaps_rollup"

    def unavailable(reason: str) -> ProcessMemory:
        return ProcessMemory(pid, None, None, None, None, f"unavailable: {reason}")

    if not (root / "self" / "smaps_rollup").exists():
        return unavailable(f"no {root}/<pid>/smaps_rollup here (needs Linux 4.14+ with procfs)")
    if not (root / str(pid)).exists():
        raise ProcessLookupError(f"no process {pid} in {root}")
    try:
        text = path.read_text()
    except PermissionError:
        return unavailable(f"{path} is not readable by this user")
    except FileNotFoundError:  # the process exited between the two checks
        raise ProcessLookupError(f"process {pid} exited before its memory was read") from None
    kb = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _SMAPS_FIELDS:
            kb[key] = int(rest.split()[0])
    missing = [f for f in _SMAPS_FIELDS if f not in kb]
    if missing:
        return unavailable(f"{path} has no field {missing[0]}")
    return ProcessMemory(
        pid=pid,
        rss_bytes=kb["Rss"] * 1024,
        pss_bytes=kb["Pss"] * 1024,
        private_bytes=(kb["Private_Clean"] + kb["Private_Dirty"]) * 1024,
        shared_bytes=(kb["Shared_Clean"] + kb["Shared_Dirty"]) * 1024,
        method="smaps_rollup",
    )


class _EpochThenMemory(torch.utils.data.Dataset):
    """One item: read every sample of ``dataset`` as an epoch would, then this process's memory."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> ProcessMemory:
        from torch.utils.data import default_collate

        for i in range(len(self.dataset)):
            default_collate([self.dataset[i]])  # a batch of one: copies the sample, as collation does
        return process_memory()


def loader_worker_memory(dataset, *, multiprocessing_context: str, timeout: float = 300.0) -> ProcessMemory:
    """Memory of a DataLoader worker after it read every sample of ``dataset`` once.

    One worker is started with ``multiprocessing_context`` (``"fork"``: inherits the parent's
    memory copy-on-write; ``"spawn"`` / ``"forkserver"``: gets the dataset pickled, so it holds its
    own copy of whatever pickling copies). It reads ``dataset[0]``, ..., ``dataset[len - 1]``, collates
    each as a batch of one (as an epoch would), then reads its own ``smaps_rollup`` and exits.
    Compare the result with the same call on a tiny dataset to separate the dataset's share from
    the cost of a worker process itself.

    Args:
        dataset: a map-style dataset (``len`` and ``[i]``); for ``spawn`` / ``forkserver`` it must be
            picklable (no lambdas or notebook-local classes).
        multiprocessing_context: one of ``"fork"``, ``"forkserver"``, ``"spawn"``.
        timeout: seconds to wait for the worker (spawned workers import torch first).
    Returns:
        The worker's :class:`ProcessMemory` (byte fields None where ``smaps_rollup`` is unavailable).
    Raises:
        TypeError: ``dataset`` has no ``len``/``[i]``, or ``multiprocessing_context`` is not a str.
        ValueError: an unknown start method, or one this platform does not offer; a non-positive timeout.
    """
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"dataset must support len() and [i], got {type(dataset).__name__}")
    if not isinstance(multiprocessing_context, str):
        raise TypeError(f"multiprocessing_context must be a str, got {type(multiprocessing_context).__name__}")
    if multiprocessing_context not in START_METHODS:
        raise ValueError(f"multiprocessing_context must be one of {START_METHODS}, got {multiprocessing_context!r}")
    import multiprocessing

    if multiprocessing_context not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start method {multiprocessing_context!r} is not available on this platform; "
            f"use one of {multiprocessing.get_all_start_methods()}"
        )
    check_positive(timeout, "timeout", allow_none=False)
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _EpochThenMemory(dataset),
        batch_size=None,
        num_workers=1,
        multiprocessing_context=multiprocessing_context,
        timeout=timeout,
    )
    (report,) = list(loader)
    return report
