"""The tar format, read strictly: every header checksum, every member size, the end-of-archive marker.

``iter_members`` walks a tar file's regular members (ustar, GNU long names, pax headers) and raises :class:`ShardError`, with the byte offset, on any defect. ``tarfile``
treats a corrupt or truncated header after the first member as the end of the archive and silently
drops the rest; a reader of training data must not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["BLOCK", "ShardError", "check_zero_tail", "iter_members", "read_member"]

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)


class ShardError(ValueError):
    """A shard is truncated or corrupt. ``shard`` is its path, ``offset`` the byte offset of the problem."""

    def __init__(self, shard: Path, offset: int, reason: str):
        super().__init__(f"{shard}: {reason} at byte offset {offset}")
        self.shard = Path(shard)
        self.offset = offset
        self.reason = reason

    def __reduce__(self):  # keep the attributes when re-raised from a DataLoader worker
        return (type(self), (self.shard, self.offset, self.reason))


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for large values
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _header_ok(block: bytes) -> bool:
    """The header checksum: the sum of the header's bytes with the checksum field read as 8 spaces.

    POSIX sums unsigned bytes; some old tars summed signed chars, where a byte b > 127 counts as
    b - 256. The signed sum is only needed when the unsigned one does not match (non-ASCII names).
    """
    try:
        stored = _octal(block[148:156])
    except ValueError:
        return False
    rest = block[:148] + block[156:]
    unsigned = sum(rest) + 8 * 32
    if stored == unsigned:
        return True
    return stored == unsigned - 256 * sum(1 for b in rest if b > 127)


_CHUNK = 1 << 20


# tar ends an archive with two zero blocks and pads it to a whole record (20 blocks, 10 KiB by default).
RECORD = 20 * BLOCK


def check_zero_tail(f, shard: Path, offset: int, file_size: int) -> None:
    """After the first end-of-archive block (``offset`` is just past it), everything up to the end of the
    file must be zero, and no longer than tar's own padding.

    GNU tar's "lone zero block" check: a zeroed sector or a zero-filled gap inside an archive, and a
    second archive appended to the first, would otherwise end the shard early without a word. Zeros
    beyond the end-of-archive marker and one record of padding are the same error seen from the end:
    writes lost in a crash leave the file's length and zeros where its last samples were.
    """
    f.seek(offset)
    pos = offset
    while pos < file_size:
        chunk = f.read(min(_CHUNK, file_size - pos))
        if not chunk:
            break
        stripped = chunk.lstrip(b"\0")
        if stripped:
            at = pos + len(chunk) - len(stripped)
            raise ShardError(
                shard,
                at,
                "data after the end-of-archive marker (a zeroed block inside the archive, or two tar files "
                f"concatenated); the marker is at byte offset {offset}",
            )
        pos += len(chunk)
    marker = offset - BLOCK
    if file_size - marker > 2 * BLOCK + RECORD:
        raise ShardError(
            shard,
            marker,
            f"{file_size - marker} bytes of zeros from here to the end of the file, where tar pads at most "
            f"{2 * BLOCK + RECORD}: the shard's later samples were lost (a crash before its writes reached "
            "the disk?) or zeroed; write it again",
        )


def _pax_records(data: bytes) -> dict[str, str]:
    """The "length key=value\\n" records of a pax header. Raises ValueError on a malformed record."""
    records, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        if length <= space - pos or pos + length > len(data) or data[pos + length - 1 : pos + length] != b"\n":
            raise ValueError(f"record at byte {pos} declares {length} bytes, which do not end in a newline")
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def read_member(f, shard: Path, offset: int, file_size: int) -> tuple[bytes, str, int, int, bytes, int] | None:
    """Parse the header chain (pax/GNU long-name headers, then the member's header) that starts at ``offset``.

    Returns:
        None if the block at ``offset`` is a zero block (the end-of-archive marker), else ``(kind, name,
        data_offset, size, fields, next_offset)``: the member's type flag, its name, where its data
        begins, its size, bytes 124:156 of its last header (size, mtime and checksum fields, which a
        reader by offsets compares to notice a changed file) and where the next header begins. The
        data is not read.
    Raises:
        ShardError: a truncated or corrupt header or member, or an end marker inside a header chain.
    """
    f.seek(offset)
    chain, long_name, pax = offset, None, {}
    while True:
        block = f.read(BLOCK)
        if not block:
            raise ShardError(shard, offset, "truncated: the end-of-archive marker is missing")
        if len(block) < BLOCK:
            raise ShardError(shard, offset, f"truncated header ({len(block)} of {BLOCK} bytes)")
        if block == ZERO_BLOCK:
            if offset != chain:
                raise ShardError(shard, offset, "unexpected end-of-archive marker")
            return None
        if not _header_ok(block):
            raise ShardError(shard, offset, "corrupt header (checksum mismatch)")
        kind = block[156:157]
        size = int(pax.get("size", _octal(block[124:136])))
        data_start = offset + BLOCK
        offset = data_start + (size + BLOCK - 1) // BLOCK * BLOCK
        if offset > file_size:
            raise ShardError(
                shard,
                data_start,
                f"truncated member data ({size} bytes declared, {max(0, file_size - data_start)} present)",
            )
        # Only the metadata members' data is read (pax records, GNU long names); samples' data is not.
        if kind in (b"x", b"L", b"g", b"K"):
            data = f.read(size)
            f.seek(offset)
            if kind == b"x":
                try:
                    pax = _pax_records(data)
                except (ValueError, UnicodeDecodeError) as err:  # a flipped bit in a length or a key
                    raise ShardError(shard, data_start, f"corrupt pax record ({err})") from err
            elif kind == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        name = pax.get("path") or long_name
        if name is None:
            name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = block[345:500].split(b"\0", 1)[0]
            if block[257:263] == b"ustar\0" and prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        return kind, name, data_start, size, block[124:156], offset


def iter_members(f, shard: Path, file_size: int) -> Iterator[tuple[int, str, int, int, bytes]]:
    """Yield ``(start_offset, name, data_offset, size, fields)`` of every regular file of the archive ``f``.

    ``start_offset`` is where the member's header chain (pax/GNU long-name headers included)
    begins, ``data_offset`` where its ``size`` bytes of data begin (the data is not read); ``fields``
    are bytes 124:156 of its last header (see :func:`read_member`). Stops at the end-of-archive
    marker, after checking that only zeros follow it, with ``f`` positioned just after the marker's
    first block; raises ShardError on any defect.
    """
    offset = 0
    while True:
        member = read_member(f, shard, offset, file_size)
        if member is None:
            if offset == 0:
                raise ShardError(shard, 0, "no members: the file starts with an end-of-archive (zero) block")
            check_zero_tail(f, shard, offset + BLOCK, file_size)
            f.seek(offset + BLOCK)
            return
        kind, name, data_start, size, fields, next_offset = member
        if kind not in (b"5", b"0", b"\0", b"7"):  # directory entries (5) carry no sample data
            raise ShardError(shard, offset, f"unsupported member type {kind!r} for {name!r}")
        if kind != b"5":
            yield offset, name, data_start, size, fields
        offset = next_offset
