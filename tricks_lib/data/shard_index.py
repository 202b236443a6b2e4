"""The index of a tar shard: where each sample lies, kept in a small checked file beside the shard.

:func:`index_tar_shard` reads every header of a shard (strictly, see :mod:`tricks_lib.data.tar_format`)
into a :class:`ShardIndex`; :func:`read_tar_samples` then slices samples out of the file by the offsets
it holds, comparing every member's header fields with the index first.

Index files: reading every header of every shard at construction costs about 10 us per sample (10 s
for a million samples, on every rank, before the first batch; far more with a cold cache). The
writer therefore keeps a small index file beside each shard (``.shard-000000.tar.idx``, hidden so no
listing of shards sees it), and :func:`load_shard_index` uses it only after checking it against the
shard (its identity, its CRC32, its layout, its first and last headers); a missing, stale or damaged
one is rebuilt from the headers.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tricks_lib._atomic import temporary_path_for, write_bytes_atomic
from tricks_lib.data.tar_format import BLOCK, ShardError, check_zero_tail, iter_members, read_member

__all__ = [
    "ShardIndex",
    "index_file_path",
    "index_tar_shard",
    "load_shard_index",
    "read_tar_samples",
    "request_read_ahead",
    "write_index_file",
]

# Members webdataset skips, so both readers see the same samples: hidden files (macOS's "._*"
# resource forks and ".DS_Store", added by tar on a Mac) and "__name__" metadata entries.
_SKIPPED_MEMBER = re.compile(r"(^|/)\.[^/]*$|__[^/]*__($|/)")
# Leading bytes of compressed files: a .tar.gz is not a tar, and "corrupt header" would mislead.
_COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


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


# ------------------------------------------------------------------------------------ index files
# The index file of "dir/shard-000000.tar" is "dir/.shard-000000.tar.idx": hidden, so that no
# listing of shards picks it up (glob("*"), a shell's `*`, webdataset given such a glob, the writer's
# "<prefix>-NNNNNN.tar" pattern, FolderDataset), while `cp -r` and `rsync -a` still copy it.
#
# Layout (little-endian): _INDEX_HEAD (magic, the shard's identity, end, N samples, M members, the
# byte lengths of the key and ext blobs), member_first (N+1 int64), member_start, data_offsets,
# sizes (M int64 each), member_ext (M int32), header_fields (M x 32 bytes), the keys and the exts
# (UTF-8, NUL-separated), then the CRC32 of everything before it.
_INDEX_MAGIC = b"TRKTIDX1"
_INDEX_HEAD = struct.Struct("<8sQqQQqQQQQQ")
_FIELDS_SIZE = 32  # bytes 124:156 of a header: size (12), mtime (12), checksum (8)


def index_file_path(shard: str | os.PathLike) -> Path:
    """The index file kept beside ``shard``: ``.<shard name>.idx`` in the same folder (hidden)."""
    shard = Path(shard)
    return shard.with_name(f".{shard.name}.idx")


def _encode_index(index: ShardIndex) -> bytes | None:
    """The index file's bytes, or None if a key or ext holds a NUL (not representable)."""
    keys, exts = "\0".join(index.keys), "\0".join(index.exts)
    if keys.count("\0") != max(len(index.keys) - 1, 0) or exts.count("\0") != max(len(index.exts) - 1, 0):
        return None
    keys, exts = keys.encode("utf-8", "surrogateescape"), exts.encode("utf-8", "surrogateescape")
    head = _INDEX_HEAD.pack(
        _INDEX_MAGIC, *index.identity, index.end, len(index), len(index.sizes), len(keys), len(exts)
    )
    body = b"".join(
        [
            head,
            index.member_first.astype("<i8").tobytes(),
            index.member_start.astype("<i8").tobytes(),
            index.data_offsets.astype("<i8").tobytes(),
            index.sizes.astype("<i8").tobytes(),
            index.member_ext.astype("<i4").tobytes(),
            np.ascontiguousarray(index.header_fields).tobytes(),
            keys,
            exts,
        ]
    )
    return body + struct.pack("<I", zlib.crc32(body))


def _decode_index(shard: Path, data: bytes, identity: tuple[int, ...]) -> ShardIndex | None:
    """The index held in an index file's bytes if they are intact, belong to the file whose identity
    is ``identity``, and describe a consistent layout; else None (the caller reads the headers)."""
    if len(data) < _INDEX_HEAD.size + 4 or not data.startswith(_INDEX_MAGIC):
        return None
    body = memoryview(data)[:-4]
    if zlib.crc32(body) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        return None  # truncated, or a flipped bit
    head = _INDEX_HEAD.unpack_from(data)
    if head[1:6] != identity:
        return None  # another file (another shard's index, a rewrite, a copy): stale
    end, n, m, keys_len, exts_len = head[6:]
    if len(data) != _INDEX_HEAD.size + 8 * (n + 1) + 24 * m + 4 * m + _FIELDS_SIZE * m + keys_len + exts_len + 4:
        return None
    at = _INDEX_HEAD.size
    # One array for the four int64 columns (views into it), then the int32 and byte columns.
    ints = np.frombuffer(data, dtype="<i8", count=n + 1 + 3 * m, offset=at).astype(np.int64, copy=False)
    first, starts, data_offsets, sizes = (
        ints[: n + 1],
        ints[n + 1 : n + 1 + m],
        ints[n + 1 + m : n + 1 + 2 * m],
        ints[n + 1 + 2 * m :],
    )
    at += ints.nbytes
    ext_ids = np.frombuffer(data, dtype="<i4", count=m, offset=at).astype(np.int32, copy=False)
    at += ext_ids.nbytes
    fields = np.frombuffer(data, dtype=np.uint8, count=_FIELDS_SIZE * m, offset=at).reshape(m, _FIELDS_SIZE)
    at += fields.nbytes
    keys = data[at : at + keys_len].decode("utf-8", "surrogateescape").split("\0") if n else []
    exts = data[at + keys_len : at + keys_len + exts_len].decode("utf-8", "surrogateescape").split("\0")
    index = ShardIndex(
        path=shard,
        keys=tuple(keys),
        offsets=tuple(starts[first[:-1]].tolist()) if m else (),
        end=end,
        size=identity[0],
        mtime_ns=identity[1],
        identity=identity,
        exts=tuple(exts) if exts_len or m else (),
        member_first=first,
        member_ext=ext_ids,
        member_start=starts,
        data_offsets=data_offsets,
        sizes=sizes,
        header_fields=fields,
        source="index file",
    )
    return index if len(keys) == n and _layout_is_consistent(index) else None


def _layout_is_consistent(index: ShardIndex) -> bool:
    """Members in file order, each inside the archive, none overlapping, every sample with a field."""
    first, starts, data, sizes = index.member_first, index.member_start, index.data_offsets, index.sizes
    if len(first) != len(index.keys) + 1 or first[0] != 0 or first[-1] != len(starts):
        return False
    if len(index.keys) and np.any(np.diff(first) < 1):
        return False
    if not len(starts):
        return index.end % BLOCK == 0 and index.end + BLOCK <= index.size
    padded_end = data + (sizes + BLOCK - 1) // BLOCK * BLOCK
    ext = index.member_ext
    return bool(
        index.end % BLOCK == 0
        and index.end + BLOCK <= index.size
        and not np.any(starts % BLOCK)
        and (data - starts).min() >= BLOCK
        and sizes.min() >= 0
        and not np.any(padded_end[:-1] > starts[1:])
        and padded_end[-1] <= index.end
        and ext.min() >= 0
        and ext.max() < len(index.exts)
    )


def _matches_file(index: ShardIndex, f) -> bool:
    """Spot checks of an index file against the shard itself: its first and last members' headers
    (name, offsets, size, fields) and the end-of-archive marker with only zeros after it.
    (Every other member's header fields are compared on each read: see read_tar_samples.)"""
    try:
        for m in {0, len(index.sizes) - 1} if len(index.sizes) else ():
            member = read_member(f, index.path, int(index.member_start[m]), index.size)
            if member is None:
                return False
            kind, name, data_offset, size, fields, _ = member
            sample = int(np.searchsorted(index.member_first, m, side="right")) - 1
            key, ext = _split_name(name, index.path, int(index.member_start[m]))
            expected = (index.keys[sample], index.exts[index.member_ext[m]], int(index.data_offsets[m]))
            if (
                (key, ext, data_offset) != expected
                or size != index.sizes[m]
                or fields != index.header_fields[m].tobytes()
            ):
                return False
        f.seek(index.end)
        if f.read(BLOCK) != bytes(BLOCK):
            return False
        check_zero_tail(f, index.path, index.end + BLOCK, index.size)
    except ShardError:
        return False
    return True


def write_index_file(index: ShardIndex, *, durable: bool = False) -> Path | None:
    """Write ``index`` into its shard's index file (:func:`index_file_path`) under a temporary name
    renamed into place, so a reader never sees half a file. Returns the path, or None where it cannot
    be written (a read-only folder, a full disk, a key holding a NUL): the index is a cache, and
    :func:`load_shard_index` then reads the headers again.

    Args:
        index: the shard's index, as :func:`index_tar_shard` returns it.
        durable: fsync the file and the folder as well (the shard writer does); readers rebuilding a
            cache skip it (an fsync costs milliseconds per file, and a torn index file fails its CRC).
    """
    data = _encode_index(index)
    if data is None:
        return None
    target = index_file_path(index.path)
    try:
        if durable:
            return write_bytes_atomic(target, data)
        tmp = temporary_path_for(target)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    except OSError:
        return None
    return target


def load_shard_index(path: str | os.PathLike, *, index_file: bool = True) -> ShardIndex:
    """The :class:`ShardIndex` of a shard, from its index file when that is valid, else by reading
    every header (:func:`index_tar_shard`), after which the index file is written for next time.

    An index file is used only if it is intact (length, CRC32), was made for this very file (the
    shard's size, mtime, device, inode and ctime), describes a consistent layout (members in order,
    inside the archive, not overlapping), and agrees with the shard's first and last headers and
    end-of-archive marker; reads then compare every member's header fields with the file. Otherwise
    (missing, stale, truncated, another shard's) it is rebuilt; where the folder is read-only the
    index stays in memory.

    Args:
        path: the tar shard.
        index_file: False to read every header and neither read nor write an index file.
    Raises:
        ShardError: on a truncated or corrupt shard. FileNotFoundError: if the shard does not exist.
    """
    path = Path(path)
    if index_file:
        with open(path, "rb") as f:
            identity = _identity(os.fstat(f.fileno()))
            try:
                data = index_file_path(path).read_bytes()
            except OSError:
                data = b""
            index = _decode_index(path, data, identity)
            if index is not None and _matches_file(index, f):
                return index
    index = index_tar_shard(path)
    if index_file:
        write_index_file(index)
    return index


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
            yield from _checked_samples(index, mapped, start, stop, _ReadAhead(mapped, first, last))


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


def _checked_samples(
    index: ShardIndex, mapped: mmap.mmap, start: int, stop: int, read_ahead: _ReadAhead
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
            for m in range(bounds[k], bounds[k + 1]):
                sample[names[m]] = mapped[begins[m] : ends[m]]
            yield sample
        lo = hi
