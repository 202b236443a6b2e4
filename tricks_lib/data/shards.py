"""Tar shards in the WebDataset layout, and an exactly-once ``IterableDataset`` over them.

Layout: a shard is a plain tar file whose members are named ``<key>.<ext>``; consecutive members
with the same key form one sample ``{"__key__": key, ext: bytes, ...}``. The key is the member name
up to the first '.' of its base name (WebDataset's rule), so shards written here are read by
``webdataset`` and shards written by ``webdataset.TarWriter`` are read here.

Why not :mod:`tarfile` for reading: ``tarfile`` treats a corrupt or truncated header after the
first member as the end of the archive and silently drops the rest of the shard. The reader here
checks every header checksum, every member size, and the end-of-archive marker, and raises
:class:`ShardError` naming the shard and the byte offset.

Exactly-once split (see :meth:`TarShardDataset.plan`): all consumers (every DataLoader worker of
every rank) compute the same global sample order (shards in order, or shuffled by ``(seed, epoch)``),
then rank ``r`` of ``R`` takes the contiguous range ``[r*N//R, (r+1)*N//R)`` of the ``N`` samples and
worker ``w`` of ``W`` takes the same-formula sub-range of its rank's range. The ranges partition
``0..N-1``, so every sample is read exactly once for any number of shards, workers and ranks, even
with fewer shards than consumers (a shard is then split between consumers by byte offset), and
consumers differ by at most one sample. Each consumer reads contiguous byte ranges: sequential IO.

Index files: reading every header of every shard at construction costs about 10 us per sample (10 s
for a million samples, on every rank, before the first batch; far more with a cold cache). The
writer therefore keeps a small index file beside each shard (``.shard-000000.tar.idx``, hidden so no
listing of shards sees it), and :func:`load_shard_index` uses it only after checking it against the
shard (see there); a missing, stale or damaged one is rebuilt from the headers.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import random
import re
import struct
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tricks_lib._atomic import atomic_path, temporary_path_for, write_bytes_atomic
from tricks_lib._validate import check_non_negative_int, check_positive
from tricks_lib.data.samples import check_samples
from tricks_lib.data.tar_format import BLOCK, ShardError, check_zero_tail, iter_members, read_member

__all__ = [
    "ShardError",
    "ShardIndex",
    "TarShardDataset",
    "index_file_path",
    "index_tar_shard",
    "load_shard_index",
    "read_tar_samples",
    "write_index_file",
    "write_tar_shards",
]


def write_tar_shards(
    samples: Iterable[dict], out_dir: str | os.PathLike, *, samples_per_shard: int, prefix: str = "shard"
) -> list[Path]:
    """Write samples into tar shards ``out_dir/<prefix>-000000.tar``, ... in the WebDataset layout.

    Each shard is written under a temporary name and renamed when complete, so an interrupted run
    leaves only complete shards under final names. Member metadata is fixed (mtime 0, uid 0, mode
    0444): the same samples give the same bytes.

    Rewriting a folder replaces its shards: after all new shards are written, shards of an earlier
    write named ``<prefix>-NNNNNN.tar`` with a higher number than the last new one are deleted, so
    ``glob("<prefix>-*.tar")`` finds exactly the new samples. (If a rewrite is interrupted, old
    shards beyond the new ones remain until a rewrite completes.) Other files are left alone.

    Args:
        samples: iterable of dicts ``{"__key__": str, ext: bytes, ...}``; keys unique, without '.'.
        out_dir: directory, created if missing.
        samples_per_shard: samples per shard (>= 1); the last shard may hold fewer.
        prefix: shard file name prefix.
    Returns:
        The shard paths, in order.
    Raises:
        TypeError/ValueError: on malformed samples, duplicate keys or a bad ``samples_per_shard``.
    """
    check_positive(samples_per_shard, "samples_per_shard", allow_none=False, integer=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[Path] = []
    seen: set[str] = set()
    it = iter(check_samples(samples))
    while True:
        first = next(it, None)
        if first is None:
            _remove_stale_shards(out, prefix, len(shards))
            return shards
        path = out / f"{prefix}-{len(shards):06d}.tar"
        with atomic_path(path) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            sample, n = first, 0
            while sample is not None:
                key = sample["__key__"]
                if key in seen:
                    raise ValueError(f"duplicate sample key {key!r}: keys must be unique")
                seen.add(key)
                for ext, value in sample.items():
                    if ext.startswith("__"):
                        continue
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(value), 0, 0o444
                    tar.addfile(info, _BytesReader(bytes(value)))
                n += 1
                sample = next(it, None) if n < samples_per_shard else None
        # After the rename (which changes the ctime, part of the identity the index file records).
        write_index_file(index_tar_shard(path), durable=True)
        shards.append(path)


def _remove_stale_shards(out: Path, prefix: str, count: int) -> None:
    """Delete ``out/<prefix>-NNNNNN.tar`` numbered ``count`` or higher (left by an earlier write), and
    their index files."""
    pattern = re.compile(re.escape(prefix) + r"-(\d{6,})\.tar")
    for path in out.glob(f"{glob.escape(prefix)}-*.tar"):
        match = pattern.fullmatch(path.name)
        if match and int(match.group(1)) >= count:
            path.unlink(missing_ok=True)
    for path in out.glob(f".{glob.escape(prefix)}-*.tar.idx"):  # also those whose shard is gone
        match = pattern.fullmatch(path.name[1:-4])
        if match and int(match.group(1)) >= count:
            path.unlink(missing_ok=True)


class _BytesReader:
    """Minimal file object for tarfile.addfile (avoids an io.BytesIO copy per member)."""

    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        chunk, self._pos = self._data[self._pos : end], min(end, len(self._data))
        return chunk


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
            if hasattr(mapped, "madvise"):
                first = index.offsets[start] // mmap.PAGESIZE * mmap.PAGESIZE
                last = index.offsets[stop] if stop < len(index) else index.end
                mapped.madvise(mmap.MADV_SEQUENTIAL, first, max(last - first, 1))
            yield from _checked_samples(index, mapped, start, stop)


def _first_changed_header(mapped: mmap.mmap, data_offsets: np.ndarray, fields: np.ndarray) -> int:
    """The position in ``data_offsets`` of the first member whose header fields differ from ``fields``, or -1."""
    view = np.frombuffer(mapped, dtype=np.uint8)
    try:
        found = view[data_offsets[:, None] + _FIELD_POSITIONS]  # (members, 32): their headers' fields
    finally:
        del view  # the mapping cannot close while an array (or a traceback) points into it
    differs = np.flatnonzero(np.any(found != fields, axis=1))
    return int(differs[0]) if len(differs) else -1


def _checked_samples(index: ShardIndex, mapped: mmap.mmap, start: int, stop: int) -> Iterator[dict]:
    keys, exts = index.keys, index.exts
    for lo in range(start, stop, _CHECK_SAMPLES):
        hi = min(lo + _CHECK_SAMPLES, stop)
        m0, m1 = int(index.member_first[lo]), int(index.member_first[hi])
        data = index.data_offsets[m0:m1]
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


# --------------------------------------------------------------------------------------- dataset
def _distributed_rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialized default process group, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _even_range(n: int, part: int, parts: int) -> tuple[int, int]:
    """The ``part``-th of ``parts`` contiguous, near-equal ranges of ``range(n)``."""
    return part * n // parts, (part + 1) * n // parts


class TarShardDataset(IterableDataset):
    """Iterate tar shards so that each sample is yielded exactly once per epoch across all
    DataLoader workers and all ranks (see the module docstring for the split).

    Args:
        shards: a path or a sequence of paths of tar shards (read in the given order).
        shuffle_buffer: 0 for the fixed order; > 0 shuffles the shard order by ``(seed, epoch)``
            and the samples of each consumer through a buffer of this many samples.
        seed: shuffling seed; must be the same on every rank.
        rank, world_size: this process's place; both None means ``torch.distributed``'s values
            when it is initialized at construction, else a single process. They are resolved here,
            in the main process, and stored: DataLoader workers started with spawn/forkserver have
            no process group, so resolving them in ``__iter__`` would make every rank read rank 0's
            share (duplicated samples). Construct the dataset after ``init_process_group``.
        transform: optional callable applied to each sample dict (e.g. decoding), in the worker.
        uneven: what to do when the samples do not divide evenly between ranks. "exact" (default):
            every sample exactly once, ranks differ by at most one sample; under DDP a rank with one
            step more than the others then waits forever in that step's all-reduce (a hang), unless
            the loop stops every rank at the same step (e.g. ``min`` of ``samples_per_rank``) or uses
            ``DDP.join()``. "pad": every rank gets ``ceil(N / R)`` samples, the last ranks repeating
            the first samples of the epoch's order (``DistributedSampler``'s default). "drop": every
            rank gets ``floor(N / R)``, the last ``N mod R`` samples of the epoch's order are skipped
            (``drop_last=True``). ``samples_per_rank`` says what each rank gets.
        index_files: True (default) to take each shard's index from the small index file beside it
            (``.<shard name>.idx``, written by ``write_tar_shards``), checked against the shard and
            rebuilt (written again) when missing, stale or damaged; where the folder is read-only the
            index is built in memory. Construction then costs about a microsecond per sample instead
            of reading every header. False: read every header and write nothing.
    Raises:
        ValueError/TypeError: on bad arguments. ShardError: on a corrupt shard (at construction,
            when its headers are checked, or while reading).
    Note:
        ``set_epoch`` reaches DataLoader workers that persist (``persistent_workers=True``): the
        epoch lives in shared memory and each worker reads it when the next epoch's iteration starts.
        Call it before iterating the loader for that epoch, as with ``DistributedSampler``.
    """

    def __init__(
        self,
        shards: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[dict], object] | None = None,
        uneven: str = "exact",
        index_files: bool = True,
    ):
        super().__init__()
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        shards = [Path(s) for s in shards]
        if not shards:
            raise ValueError("shards is empty: pass at least one tar shard")
        check_non_negative_int(shuffle_buffer, "shuffle_buffer")
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither")
        if world_size is not None:
            check_positive(world_size, "world_size", allow_none=False, integer=True)
            check_non_negative_int(rank, "rank")
            if rank >= world_size:
                raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if transform is not None and not callable(transform):
            raise TypeError("transform must be callable or None")
        if not isinstance(index_files, bool):
            raise TypeError(f"index_files must be True or False, got {type(index_files).__name__}")
        if uneven not in ("exact", "pad", "drop"):
            raise ValueError(f"uneven must be 'exact', 'pad' or 'drop', got {uneven!r}")
        self.uneven = uneven
        resolved = [p.resolve() for p in shards]
        if len(set(resolved)) != len(resolved):
            twice = next(p for p in resolved if resolved.count(p) > 1)
            raise ValueError(f"shard {twice} is listed twice: every sample would be read twice per epoch")
        if world_size is None:
            rank, world_size = _distributed_rank_and_world()
        self.indexes = tuple(load_shard_index(p, index_file=index_files) for p in shards)
        self.shuffle_buffer, self.seed, self.transform = shuffle_buffer, seed, transform
        self.rank, self.world_size = rank, world_size
        # In shared memory, so that set_epoch reaches DataLoader workers that persist across epochs
        # (persistent_workers=True): each worker reads it when its __iter__ starts the next epoch.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration uses (set with ``set_epoch``)."""
        return int(self._epoch)

    @property
    def num_samples(self) -> int:
        """Samples in all shards together (one epoch over all ranks and workers)."""
        return sum(len(ix) for ix in self.indexes)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` to seed the shuffle of the next iteration (same value on every rank)."""
        check_non_negative_int(epoch, "epoch")
        self._epoch.fill_(epoch)

    def plan(
        self, rank: int, world_size: int, worker: int = 0, num_workers: int = 1, *, epoch: int | None = None
    ) -> list[tuple[int, int, int]]:
        """The pieces ``(shard number, first sample, end sample)`` one consumer reads in ``epoch``
        (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        order = list(range(len(self.indexes)))
        if self.shuffle_buffer:
            random.Random(f"shards:{self.seed}:{epoch}").shuffle(order)
        total = self.num_samples
        lo, hi = self._rank_range(rank, world_size)
        wlo, whi = _even_range(hi - lo, worker, num_workers)
        lo, hi = lo + wlo, lo + whi
        pieces = []
        if total == 0:
            return pieces
        # Positions past the end (uneven="pad") wrap around to the start of the epoch's order.
        while lo < hi:
            turn_lo, turn_hi = lo % total, min(hi - lo, total - lo % total) + lo % total
            base = 0
            for shard in order:
                n = len(self.indexes[shard])
                start, stop = max(turn_lo, base), min(turn_hi, base + n)
                if start < stop:
                    pieces.append((shard, start - base, stop - base))
                base += n
            lo += turn_hi - turn_lo
        return pieces

    def _rank_range(self, rank: int, world_size: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the epoch's order that ``rank`` reads (past N: padding)."""
        total = self.num_samples
        if self.uneven == "exact":
            return _even_range(total, rank, world_size)
        per_rank = -(-total // world_size) if self.uneven == "pad" else total // world_size
        return rank * per_rank, (rank + 1) * per_rank

    @property
    def samples_per_rank(self) -> tuple[int, ...]:
        """Samples each rank reads per epoch: all equal with ``uneven="pad"`` or ``"drop"``."""
        return tuple(hi - lo for lo, hi in (self._rank_range(r, self.world_size) for r in range(self.world_size)))

    def __iter__(self) -> Iterator[object]:
        rank, world_size = self.rank, self.world_size  # resolved at construction, not in the worker
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch  # once: a set_epoch during this iteration applies to the next one
        samples = (
            sample
            for shard, start, stop in self.plan(rank, world_size, worker, num_workers, epoch=epoch)
            for sample in read_tar_samples(self.indexes[shard], start, stop)
        )
        if self.shuffle_buffer:
            rng = random.Random(f"buffer:{self.seed}:{epoch}:{rank}:{worker}")
            samples = _buffer_shuffle(samples, self.shuffle_buffer, rng)
        for sample in samples:
            yield sample if self.transform is None else self.transform(sample)

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.indexes)} shards, {self.num_samples} samples, "
            f"rank={self.rank}/{self.world_size}, shuffle_buffer={self.shuffle_buffer}, "
            f"seed={self.seed}, epoch={self.epoch}, uneven={self.uneven!r})"
        )


def _buffer_shuffle(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Shuffle a stream through a buffer of ``size`` items (the WebDataset/TF approach)."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer
