"""The index file kept beside a tar shard, checked against the shard before it is trusted.

Reading every header of every shard at construction costs about 10 us per sample (10 s for a million
samples, on every rank, before the first batch; far more with a cold cache). The shard writer
(``write_tar_shards``) therefore keeps a small index file beside each shard (``.shard-000000.tar.idx``,
hidden so no listing of shards sees it), and :func:`load_shard_index` uses it only after checking it
against the shard (its identity, its CRC32, its layout, its first and last headers); a missing, stale
or damaged one is rebuilt from the headers (:func:`tricks_lib.data.shard_index.index_tar_shard`).
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from tricks_lib._atomic import temporary_path_for, write_bytes_atomic
from tricks_lib.data.shard_index import _FIELDS_SIZE, ShardIndex, _identity, _split_name, index_tar_shard
from tricks_lib.data.tar_format import BLOCK, ShardError, check_zero_tail, read_member

__all__ = ["index_file_path", "load_shard_index", "write_index_file"]

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


def _decode_index(shard: Path, data: bytes, identity: tuple[int, ...] | None) -> ShardIndex | None:
    """The index held in an index file's bytes if they are intact, belong to the file whose identity
    is ``identity`` (None: whichever file they were made for), and describe a consistent layout; else
    None (the caller reads the headers)."""
    if len(data) < _INDEX_HEAD.size + 4 or not data.startswith(_INDEX_MAGIC):
        return None
    body = memoryview(data)[:-4]
    if zlib.crc32(body) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        return None  # truncated, or a flipped bit
    head = _INDEX_HEAD.unpack_from(data)
    if identity is None:
        identity = tuple(head[1:6])
    elif head[1:6] != identity:
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
        ShardError: on a truncated or corrupt shard, or one that holds fewer samples than its index file
            recorded (the index file is kept). FileNotFoundError: if the shard does not exist.
    """
    path = Path(path)
    data = b""
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
        _refuse_lost_samples(index, _decode_index(path, data, None))
        write_index_file(index)
    return index


def _refuse_lost_samples(index: ShardIndex, recorded: ShardIndex | None) -> None:
    """An index file that recorded more samples than the shard now holds, the shard's keys being the
    first of its keys, describes this shard before it lost its tail (lost writes, a truncation): that is
    an error to report, never a reason to replace the index file with a smaller one."""
    if recorded is None or len(recorded) <= len(index) or recorded.keys[: len(index)] != index.keys:
        return
    raise ShardError(
        index.path,
        index.end,
        f"the shard holds {len(index)} samples where its index file ({index_file_path(index.path).name}) "
        f"recorded {len(recorded)}, from key {recorded.keys[len(index)]!r} on: its tail was lost or cut "
        "off. Write the shard again; if it is meant to be shorter now, delete the index file",
    )
