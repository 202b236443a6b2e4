"""The index of a tar shard: where each sample lies, and reading samples by it.

:func:`index_tar_shard` reads every header of a shard (strictly, see :mod:`tricks_lib.data.tar_format`)
into a :class:`ShardIndex`; :func:`read_tar_samples` then slices samples out of the file by the offsets
it holds, comparing every member's header fields with the index first.

The checked index file kept beside each shard, so that the headers need not be read again, is
:mod:`tricks_lib.data.shard_index_file`.
"""

from __future__ import annotations

import bisect
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tricks_lib.data.tar_format import BLOCK, ShardError, iter_members

__all__ = ["ShardIndex", "index_tar_shard", "read_tar_samples", "request_read_ahead"]

# Members webdataset skips, so both readers see the same samples: hidden files (macOS's "._*"
# resource forks and ".DS_Store", added by tar on a Mac) and "__name__" metadata entries.
_SKIPPED_MEMBER = re.compile(r"(^|/)\.[^/]*$|__[^/]*__($|/)")
# Leading bytes of compressed files: a .tar.gz is not a tar, and "corrupt header" would mislead.
_COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_FIELDS_SIZE = 32  # bytes 124:156 of a header: size (12), mtime (12), checksum (8)


def _split_name(name: str, shard: Path, offset: int) -> tuple[str, str]:
    """``(key, ext)`` of a member: the key up to the first '.' of the base name, the extension
    lower-cased (webdataset's rule, so ``a.JPG`` and ``a.jpg`` are the same field in both readers)."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        raise ShardError(shard, offset, f"member {name!r} is not named <key>.<ext>")
    return (f"{head}/{stem}" if head else stem), ext.lower()


@dataclass(frozen=True, repr=False, eq=False)
class ShardIndex:
    """Where each sample of one shard lies, so that a read slices the file without parsing headers.

    ``keys[i]`` and ``offsets[i]`` are sample ``i``'s key and first byte; ``end`` is the offset of the
    end-of-archive marker; ``identity`` identifies the file: size, mtime, and device, inode and
    ctime, so a file rewritten in place with its mtime restored (``cp -p``, ``rsync -a``) or
    replaced by a rename is noticed. Members (the fields of all samples, in file order) are arrays:
    sample ``i`` owns members ``member_first[i]:member_first[i + 1]``; member ``m`` is the field
    ``exts[member_ext[m]]``, whose header chain starts at ``member_start[m]`` and whose
    ``sizes[m]`` bytes start at ``data_offsets[m]``; ``header_fields[m]`` holds bytes 124:156 of
    its last header (size, mtime, checksum), compared with the file on every read. ``source`` says
    where the index came from: ``"headers"`` (every header read) or ``"index file"`` (the shard's
    index file, see :func:`load_shard_index`).
    """

    path: Path
    keys: tuple[str, ...]
    offsets: tuple[int, ...]
    end: int
    size: int
    mtime_ns: int
    identity: tuple[int, ...]
    exts: tuple[str, ...]
    member_first: np.ndarray  # (N + 1,) int64
    member_ext: np.ndarray  # (M,) int32
    member_start: np.ndarray  # (M,) int64
    data_offsets: np.ndarray  # (M,) int64
    sizes: np.ndarray  # (M,) int64
    header_fields: np.ndarray  # (M, 32) uint8
    source: str = "headers"

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def members(self) -> tuple[tuple[tuple[str, int, int], ...], ...]:
        """Per sample, its fields as ``(ext, data offset, size)`` (built on demand: tuples are slow)."""
        names = [self.exts[j] for j in self.member_ext.tolist()]
        offsets, sizes, first = self.data_offsets.tolist(), self.sizes.tolist(), self.member_first.tolist()
        return tuple(
            tuple((names[m], offsets[m], sizes[m]) for m in range(first[i], first[i + 1])) for i in range(len(self))
        )

    def __repr__(self) -> str:
        return f"ShardIndex({self.path.name!r}, {len(self.keys)} samples, {self.size} bytes, from {self.source})"


def index_tar_shard(path: str | os.PathLike) -> ShardIndex:
    """Read every header of a shard (not the data) and return its :class:`ShardIndex`.

    Raises:
        ShardError: on a truncated or corrupt shard, a misnamed member or a repeated key.
        FileNotFoundError: if the file does not exist.
    """
    path = Path(path)
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        magic = f.read(6)
        for prefix, kind in _COMPRESSION_MAGIC.items():
            if magic.startswith(prefix):
                raise ShardError(
                    path,
                    0,
                    f"{kind}-compressed shard: TarShardDataset reads uncompressed tar shards only "
                    "(random access by offset); decompress it, or read it with webdataset",
                )
        keys, first, ext_ids, starts, data_offsets, sizes, fields = [], [], [], [], [], [], []
        ext_table: dict[str, int] = {}
        seen, current, exts = set(), None, set()
        for start, name, data_offset, size, header in iter_members(f, path, stat.st_size):
            if _SKIPPED_MEMBER.search(name):
                continue
            key, ext = _split_name(name, path, start)
            if key != current:
                if key in seen:
                    raise ShardError(path, start, f"key {key!r} appears in two separate groups")
                seen.add(key)
                keys.append(key)
                first.append(len(starts))
                current, exts = key, set()
            if ext in exts:
                raise ShardError(path, start, f"member {name!r} appears twice")
            exts.add(ext)
            ext_ids.append(ext_table.setdefault(ext, len(ext_table)))
            starts.append(start)
            data_offsets.append(data_offset)
            sizes.append(size)
            fields.append(header)
        end = f.tell() - BLOCK
        if _identity(os.fstat(f.fileno())) != _identity(stat):
            raise ShardError(path, 0, "shard changed while it was being indexed; index it again")
    member_start = np.array(starts, dtype=np.int64)
    first.append(len(starts))
    return ShardIndex(
        path=path,
        keys=tuple(keys),
        offsets=tuple(member_start[first[:-1]].tolist()),
        end=end,
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        identity=_identity(stat),
        exts=tuple(ext_table),
        member_first=np.array(first, dtype=np.int64),
        member_ext=np.array(ext_ids, dtype=np.int32),
        member_start=member_start,
        data_offsets=np.array(data_offsets, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int64),
        header_fields=np.frombuffer(b"".join(fields), dtype=np.uint8).reshape(-1, _FIELDS_SIZE),
    )


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino, stat.st_ctime_ns)


# Header fields are compared with the index for this many samples at a time, just before they are read.
_CHECK_SAMPLES = 256
_CHECK_BYTES = 1 << 20
_FIELD_POSITIONS = np.arange(124 - BLOCK, 124 - BLOCK + _FIELDS_SIZE)  # relative to a member's data offset


def read_tar_samples(index: ShardIndex, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Yield samples ``start..stop-1`` of an indexed shard as ``{"__key__": key, ext: bytes}``.

    The data is sliced from one read-only mapping by the offsets the index holds. Before a block of
    samples is read, the size, mtime and checksum fields of their members' headers are compared with
    the index (one vectorized gather), so an index that no longer describes the file raises instead
    of returning other bytes, even if the file kept its identity.

    Raises:
        ShardError: if the shard is corrupt or changed since it was indexed.
    """
    stop = len(index) if stop is None else stop
    if not 0 <= start <= stop <= len(index):
        raise ValueError(f"need 0 <= start <= stop <= {len(index)}, got {start}, {stop}")
    if start == stop:
        return
    with open(index.path, "rb") as f:
        stat = os.fstat(f.fileno())
        if _identity(stat) != index.identity:
            raise ShardError(index.path, 0, "shard changed since it was indexed; index it again")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            first, last = _byte_range(index, start, stop)
            first = first // mmap.PAGESIZE * mmap.PAGESIZE
            if hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_SEQUENTIAL, first, max(last - first, 1))
            yield from _checked_samples(index, mapped, start, stop, _ReadAhead(mapped, first, last), f.fileno())


def _byte_range(index: ShardIndex, start: int, stop: int) -> tuple[int, int]:
    """The bytes of the shard that samples ``start..stop-1`` occupy: from the first one's header to the next's."""
    return int(index.offsets[start]), int(index.offsets[stop]) if stop < len(index) else index.end


def request_read_ahead(index: ShardIndex, start: int = 0, stop: int | None = None) -> None:
    """Ask the kernel to start reading samples ``start..stop-1`` of a shard (up to 16 MiB) into the page cache.

    ``posix_fadvise(POSIX_FADV_WILLNEED)`` returns at once; the reads proceed while the caller works
    on something else. ``TarShardDataset`` calls it for the next shard of its plan when it starts a
    shard, so on a cold cache the next shard's first blocks are on their way when the reader gets
    there, instead of every shard starting with a wait for its first read. No-op where the call or
    the file is missing (the read that follows reports a missing file).
    """
    stop = len(index) if stop is None else stop
    if not hasattr(os, "posix_fadvise") or not 0 <= start < stop <= len(index):
        return
    first, last = _byte_range(index, start, stop)
    try:
        fd = os.open(index.path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, first, min(last - first, _ReadAhead.READ_AHEAD), os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


class _ReadAhead:
    """Keeps the kernel reading ``READ_AHEAD`` bytes past where the reader is (``MADV_WILLNEED``).

    On a cold page cache, a mapping is read one page fault at a time: each fault waits for its read,
    and readahead (even with ``MADV_SEQUENTIAL``) only starts the next reads once the reader gets
    there. Asking for the next window in advance lets the disk work while the reader copies: with
    it, 18 KiB samples went from 0.93x to 1.00x of ``f.read()``'s bandwidth and 200 KiB ones from
    0.77x to 0.84x (benchmarks/tar_reader.py, load 2.4-2.9; the rest came from checking headers just
    ahead of the reader). On a warm cache it costs one system call per window.
    """

    READ_AHEAD = 16 << 20

    def __init__(self, mapped: mmap.mmap, first: int, last: int):
        self.mapped, self.requested, self.last = mapped, first, last

    def reach(self, position: int) -> None:
        """Make sure everything up to ``position + READ_AHEAD`` (within the range) has been asked for."""
        if not hasattr(self.mapped, "madvise"):
            return
        want = min(position + self.READ_AHEAD, self.last)
        if want - self.requested >= self.READ_AHEAD // 2 or (want == self.last and want > self.requested):
            self.mapped.madvise(mmap.MADV_WILLNEED, self.requested, want - self.requested)
            self.requested = (want + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


def _first_changed_header(mapped: mmap.mmap, data_offsets: np.ndarray, fields: np.ndarray) -> int:
    """The position in ``data_offsets`` of the first member whose header fields differ from ``fields``, or -1."""
    view = np.frombuffer(mapped, dtype=np.uint8)
    try:
        found = view[data_offsets[:, None] + _FIELD_POSITIONS]  # (members, 32): their headers' fields
    finally:
        del view  # the mapping cannot close while an array (or a traceback) points into it
    differs = np.flatnonzero(np.any(found != fields, axis=1))
    return int(differs[0]) if len(differs) else -1


def _refuse_cut_short(index: ShardIndex, fd: int, needed: int) -> None:
    """A mapped page past the file's end kills the process (SIGBUS) when read: check the file still reaches
    ``needed`` first (a shard truncated, or copied over in place, while it is read)."""
    size = os.fstat(fd).st_size
    if size < needed:
        raise ShardError(
            index.path,
            size,
            f"the shard was cut to {size} bytes while it was read (it held {index.size}): it was truncated or "
            "copied over in place; write new shards under new names, or wait for the copy, then read it again",
        )


def _checked_samples(
    index: ShardIndex, mapped: mmap.mmap, start: int, stop: int, read_ahead: _ReadAhead, fd: int
) -> Iterator[dict]:
    keys, exts = index.keys, index.exts
    lo = start
    while lo < stop:
        # A block is at most _CHECK_SAMPLES samples and _CHECK_BYTES bytes (at least one sample): its
        # headers are gathered before its data is read, and on a cold cache each header page far ahead
        # of the reader is a read the reader waits for (with 50 samples of 200 KiB per block, that
        # check alone waited for most of the shard, and the reader ran at 0.77x of f.read()).
        hi = min(lo + _CHECK_SAMPLES, stop)
        hi = max(lo + 1, bisect.bisect_right(index.offsets, index.offsets[lo] + _CHECK_BYTES, lo, hi))
        m0, m1 = int(index.member_first[lo]), int(index.member_first[hi])
        data = index.data_offsets[m0:m1]
        read_ahead.reach(int(data[0]) if len(data) else 0)
        _refuse_cut_short(index, fd, int(data[-1]) if len(data) else 0)  # the block's headers are mapped pages
        changed = _first_changed_header(mapped, data, index.header_fields[m0:m1])
        if changed >= 0:
            raise ShardError(
                index.path,
                int(data[changed]) - BLOCK,
                "this header differs from the shard's index: the shard changed since it was indexed "
                "(keeping its size and times); index it again",
            )
        names = [exts[j] for j in index.member_ext[m0:m1].tolist()]
        begins = data.tolist()
        ends = (data + index.sizes[m0:m1]).tolist()
        bounds = (index.member_first[lo : hi + 1] - m0).tolist()
        for k in range(hi - lo):
            sample = {"__key__": keys[lo + k]}
            if bounds[k + 1] > bounds[k]:  # the consumer ran since the last check: the file may be shorter now
                _refuse_cut_short(index, fd, ends[bounds[k + 1] - 1])
            for m in range(bounds[k], bounds[k + 1]):
                sample[names[m]] = mapped[begins[m] : ends[m]]
            yield sample
        lo = hi
