"""TFRecord as a one-file container: :func:`write_tfrecord`, and :func:`read_tfrecord`, a sequential
reader that checks both CRC32C checksums of every record. The sample check is shared:
:mod:`tricks_lib.data.containers`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from tricks_lib._atomic import atomic_path
from tricks_lib.data.containers import _fields_and_list

__all__ = ["read_tfrecord", "write_tfrecord"]


def write_tfrecord(samples: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write samples as TFRecord ``Example`` records (the ``tfrecord`` package), atomically."""
    import tfrecord

    samples, fields = _fields_and_list(samples)
    path = Path(path)
    with atomic_path(path) as tmp:
        writer = tfrecord.TFRecordWriter(str(tmp))
        try:
            for s in samples:
                record = {"__key__": (s["__key__"].encode(), "byte")}
                record.update({f: (bytes(s[f]), "byte") for f in fields})
                writer.write(record)
        finally:
            writer.close()
    return path


_TFRECORD_CRC_MASK = 0xA282EAD8


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C, rotated right by 15 bits, plus a constant (mod 2**32)."""
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _TFRECORD_CRC_MASK) & 0xFFFFFFFF


def read_tfrecord(path: str | os.PathLike, fields: Iterable[str]) -> Iterator[dict]:
    """Yield the samples of a TFRecord file made by :func:`write_tfrecord`, in order.

    Each record is ``uint64 length, uint32 masked CRC32C of the length, data, uint32 masked CRC32C
    of the data``; both checksums are checked, as TensorFlow does (the ``tfrecord`` package's reader
    skips them, so a flipped payload bit would be read silently). TFRecord has no random access
    without a separate index file, so this reader is sequential.

    Raises:
        ShardError: a truncated record, a checksum mismatch, or a record without a field.
    """
    from tfrecord import example_pb2

    from tricks_lib.data.tar_format import ShardError

    path, fields = Path(path), list(fields)
    with open(path, "rb") as f:
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ShardError(path, offset, f"truncated record header ({len(header)} of 12 bytes)")
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc32c(header[:8]) != length_crc:
                raise ShardError(path, offset, "record length fails its CRC32C (corrupt length)")
            data, data_crc = f.read(length), f.read(4)
            if len(data) < length or len(data_crc) < 4:
                raise ShardError(path, offset, f"truncated record ({length} bytes declared)")
            if _masked_crc32c(data) != struct.unpack("<I", data_crc)[0]:
                raise ShardError(path, offset + 12, "record data fails its CRC32C (corrupt data)")
            example = example_pb2.Example()
            example.ParseFromString(data)
            features = example.features.feature
            missing = [name for name in ["__key__", *fields] if name not in features]
            if missing:
                raise ShardError(path, offset, f"record has no field {missing[0]!r} (fields: {sorted(features)})")
            sample = {"__key__": features["__key__"].bytes_list.value[0].decode()}
            sample.update({name: features[name].bytes_list.value[0] for name in fields})
            yield sample
            offset += 12 + length + 4
