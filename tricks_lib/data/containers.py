"""One-file containers for many small samples: writers (atomic) and readers.

Every writer takes WebDataset-style samples ``{"__key__": str, ext: bytes, ...}`` (all samples with
the same fields) and writes under a temporary name that is renamed on success. Every map-style
reader returns the same dicts, so the formats can be swapped in one line:

=================  =========================  ===========================================
format             writer                     reader
=================  =========================  ===========================================
folder of files    ``write_image_folder``     :class:`FolderDataset`
LMDB               :func:`write_lmdb`         :class:`LmdbDataset`
HDF5 (h5py)        :func:`write_hdf5`         :class:`Hdf5Dataset`
TFRecord           :func:`write_tfrecord`     :func:`read_tfrecord` (sequential only)
one ``.pt`` file   :func:`write_pt`           :class:`PtDataset` (``torch.load(mmap=True)``)
numpy ``.npy``     :func:`write_npy`          ``np.load(path, mmap_mode="r")``
=================  =========================  ===========================================

LMDB and HDF5 handles are opened lazily in the process that reads (they must not cross a
``fork`` into DataLoader workers).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from tricks_lib._atomic import atomic_path
from tricks_lib.data.samples import check_samples

__all__ = [
    "FolderDataset",
    "Hdf5Dataset",
    "LmdbDataset",
    "PtDataset",
    "read_tfrecord",
    "write_hdf5",
    "write_lmdb",
    "write_npy",
    "write_pt",
    "write_tfrecord",
]


def _fields_and_list(samples: Iterable[dict]) -> tuple[list[dict], tuple[str, ...]]:
    samples = list(check_samples(samples))
    if not samples:
        raise ValueError("samples is empty")
    fields = tuple(k for k in samples[0] if not k.startswith("__"))
    keys = set()
    for s in samples:
        if tuple(k for k in s if not k.startswith("__")) != fields:
            raise ValueError(
                f"sample {s['__key__']!r} has fields different from {fields}; "
                "all samples need the same fields in the same order"
            )
        if s["__key__"] in keys:
            raise ValueError(f"duplicate sample key {s['__key__']!r}")
        keys.add(s["__key__"])
    return samples, fields


class _SampleDataset(Dataset):
    """Shared part of the map-style readers: ``transform`` and a short repr."""

    def __init__(self, path: str | os.PathLike, transform: Callable[[dict], object] | None):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path} does not exist")
        if transform is not None and not callable(transform):
            raise TypeError("transform must be callable or None")
        self.transform = transform

    def _out(self, sample: dict) -> object:
        return sample if self.transform is None else self.transform(sample)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.name!r}, {len(self)} samples)"


class _PerProcessHandleDataset(_SampleDataset):
    """A reader that keeps one open handle per process: file handles must not cross a fork
    (DataLoader workers), so the first read in each process opens its own."""

    # Close a handle inherited through fork before opening a new one (LMDB requires it).
    _close_inherited = False

    def __init__(self, path: str | os.PathLike, transform: Callable[[dict], object] | None):
        super().__init__(path, transform)
        self._handle, self._pid = None, None

    def _open(self):
        raise NotImplementedError

    def _current_handle(self):
        if self._pid != os.getpid():  # first use in this process (e.g. a DataLoader worker)
            if self._handle is not None and self._close_inherited:
                self._handle.close()
            self._handle, self._pid = self._open(), os.getpid()
        return self._handle

    def close(self) -> None:
        """Close this process's handle; the next read reopens it."""
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle, self._pid = None, None

    def __getstate__(self):
        return {**self.__dict__, "_handle": None, "_pid": None}


class FolderDataset(_SampleDataset):
    """Samples stored as one file per field (``<key>.<ext>``) in a folder, read with ``open``."""

    def __init__(self, root: str | os.PathLike, *, transform: Callable[[dict], object] | None = None):
        super().__init__(root, transform)
        groups: dict[str, dict[str, Path]] = {}
        for p in sorted(self.path.rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                rel = p.relative_to(self.path).as_posix()
                head, _, base = rel.rpartition("/")
                stem, _, ext = base.partition(".")
                groups.setdefault(f"{head}/{stem}" if head else stem, {})[ext] = p
        self.keys = sorted(groups)
        self._files = [groups[k] for k in self.keys]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> object:
        sample = {"__key__": self.keys[i]}
        for ext, p in self._files[i].items():
            with open(p, "rb") as f:
                sample[ext] = f.read()
        return self._out(sample)


def write_lmdb(samples: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write samples to one LMDB file (``subdir=False``), atomically. Returns the path."""
    import lmdb

    samples, fields = _fields_and_list(samples)
    path = Path(path)
    payload = sum(len(s[f]) for s in samples for f in fields)
    map_size = 2 * payload + 4096 * 4 * len(samples) * len(fields) + (16 << 20)
    with atomic_path(path) as tmp:
        env = lmdb.open(str(tmp), subdir=False, lock=False, map_size=map_size)
        try:
            with env.begin(write=True) as txn:
                txn.put(b"__keys__", "\n".join(s["__key__"] for s in samples).encode())
                txn.put(b"__fields__", ",".join(fields).encode())
                for s in samples:
                    for f in fields:
                        txn.put(f"{s['__key__']}.{f}".encode(), bytes(s[f]))
            env.sync(True)
        finally:
            env.close()
    return path


_LMDB_MAGIC = 0xBEEFC0DE


def check_lmdb_file(path: str | os.PathLike) -> int:
    """Check an LMDB data file against its own meta pages before it is memory-mapped; return its page size.

    LMDB maps the file and trusts it: a file shorter than its newest meta page says (a truncated
    copy, a full disk) returns wrong bytes or kills the reader with SIGBUS, in a DataLoader worker
    too. Each of the two meta pages (0 and 1) holds the last page number in use and a transaction
    id; the newest valid one decides the size the file must have.

    Raises:
        ShardError: the file is not an LMDB data file, or is shorter than its meta page requires.
    """
    from tricks_lib.data.tar_format import ShardError

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16 + 16)
        if len(head) < 32 or struct.unpack_from("<I", head, 16)[0] != _LMDB_MAGIC:
            raise ShardError(path, 16, "not an LMDB data file (no meta page magic): pass a file written by write_lmdb")
        metas = []
        for page_size in (4096, 8192, 16384, 32768, 65536):
            f.seek(page_size)
            page = f.read(160)
            if len(page) == 160 and struct.unpack_from("<I", page, 16)[0] == _LMDB_MAGIC:
                f.seek(0)
                metas = [f.read(160), page]
                break
        if not metas:
            raise ShardError(path, 4096, "LMDB meta page 1 is missing: the file is truncated or not an LMDB file")
    # MDB_meta after the 16-byte page header: magic, version, address, mapsize, two 48-byte MDB_db,
    # then the last used page number and the transaction id.
    last_page, _ = max((struct.unpack_from("<QQ", m, 16 + 120) for m in metas), key=lambda lt: lt[1])
    needed = (last_page + 1) * page_size
    if size < needed:
        raise ShardError(
            path,
            size,
            f"truncated LMDB file: its meta page needs {needed} bytes ({last_page + 1} pages), it has {size}",
        )
    return page_size


class LmdbDataset(_PerProcessHandleDataset):
    """Read an LMDB file made by :func:`write_lmdb` (read-only, no lock, opened per process).

    The file is checked against its meta pages at construction (see ``check_lmdb_file``) and
    again in each process that opens it, so a truncated file is an error, not a SIGBUS.

    Raises:
        ShardError: a truncated file, or one not written by ``write_lmdb``.
    """

    def __init__(self, path: str | os.PathLike, *, transform: Callable[[dict], object] | None = None):
        from tricks_lib.data.tar_format import ShardError

        super().__init__(path, transform)
        env = self._open()
        with env.begin() as txn:
            keys, fields = txn.get(b"__keys__"), txn.get(b"__fields__")
        env.close()
        if keys is None or fields is None:
            raise ShardError(
                self.path,
                0,
                "an LMDB without the __keys__/__fields__ entries that write_lmdb stores: not written by write_lmdb",
            )
        self.keys = keys.decode().split("\n")
        self.fields = tuple(fields.decode().split(","))

    def _open(self):
        import lmdb

        check_lmdb_file(self.path)
        return lmdb.open(str(self.path), subdir=False, readonly=True, lock=False, readahead=False, meminit=False)

    def __len__(self) -> int:
        return len(self.keys)

    _close_inherited = True  # an environment inherited through fork must not be used

    def __getitem__(self, i: int) -> object:
        key = self.keys[i]
        with self._current_handle().begin(buffers=False) as txn:
            sample = {"__key__": key}
            for field in self.fields:
                value = txn.get(f"{key}.{field}".encode())
                if value is None:  # LMDB's get() returns None for a missing key: never hand that on
                    raise KeyError(f"{self.path}: sample {key!r} has no {field!r} entry (the file was changed?)")
                sample[field] = value
        return self._out(sample)


_HDF5_FORMAT = "tricks_lib flat fields v3"
_HDF5_META_LIMIT = 1 << 16  # bytes of the meta dataset a reader accepts (field names and a count)
_HDF5_CHUNK = 1 << 16  # bytes per chunk of a field's data: each chunk carries a Fletcher-32 checksum
_HDF5_KEY_LIMIT = 4096  # longest key (bytes) a reader accepts before reading the keys


def write_hdf5(samples: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write samples to one HDF5 file, atomically. Returns the path.

    Layout: a ``keys`` dataset (fixed-length UTF-8 byte strings) and, per field ``f``, a flat uint8
    dataset ``fields/f/data`` of all samples' bytes with ``fields/f/offsets`` (int64, N+1) marking where
    each starts; a small ``meta`` dataset (JSON) records the format, the sample count and the field
    names. Every dataset is chunked with HDF5's Fletcher-32 checksum filter and the file uses the
    newest format (``libver="latest"``), whose metadata (superblock, object headers, chunk indexes)
    carries checksums: a flipped bit anywhere is an error when read, not other bytes, a hang or a
    crash. Two layouts before this one failed that: variable-length data lives in HDF5's global heap,
    which has no checksum (one flipped length byte made a read allocate without bound, others crashed
    the process); and root attributes, which held the metadata next, are read without any check
    (one flip of the ~1,300 in the test hung inside the HDF5 C library's attribute read, and in a small
    file with such attributes 18 of 9,146 single-bit flips read other values silently). In this
    layout every single-bit flip tried, at every byte of a small file, read the same samples or raised.
    """
    import h5py

    samples, fields = _fields_and_list(samples)
    path = Path(path)
    keys = np.array([s["__key__"].encode() for s in samples], dtype=bytes)
    with atomic_path(path) as tmp, h5py.File(tmp, "w", libver="latest") as h5:
        meta = json.dumps({"format": _HDF5_FORMAT, "count": len(samples), "fields": list(fields)}).encode()
        h5.create_dataset("meta", data=np.frombuffer(meta, dtype=np.uint8), chunks=(len(meta),), fletcher32=True)
        h5.create_dataset("keys", data=keys, chunks=(min(len(keys), 4096),), fletcher32=True)
        for f in fields:
            sizes = np.array([0] + [len(s[f]) for s in samples], dtype=np.int64)
            offsets = np.cumsum(sizes)
            group = h5.create_group(f"fields/{f}")
            group.create_dataset("offsets", data=offsets, chunks=(min(len(offsets), 8192),), fletcher32=True)
            data = group.create_dataset(
                "data",
                shape=(int(offsets[-1]),),
                maxshape=(None,),
                dtype=np.uint8,
                chunks=(max(1, min(_HDF5_CHUNK, int(offsets[-1]))),),
                fletcher32=True,
            )
            for s, start, stop in zip(samples, offsets[:-1].tolist(), offsets[1:].tolist()):
                if stop > start:
                    data[start:stop] = np.frombuffer(bytes(s[f]), dtype=np.uint8)
    return path


def _checked_dataset(h5, name: str, path: Path, shape: tuple[int, ...], kind: str, max_bytes: int):
    """The dataset ``name`` after checking its stored shape, type and size against what the writer
    recorded, before any element is read (a corrupt shape would make a read allocate without bound)."""
    from tricks_lib.data.tar_format import ShardError

    ds = h5.get(name)
    if ds is None or not hasattr(ds, "dtype"):
        raise ShardError(path, 0, f"HDF5 file has no dataset {name!r}: not written by write_hdf5, or damaged")
    if ds.shape != shape or ds.dtype.kind != kind or ds.dtype.itemsize * int(np.prod(shape)) > max_bytes:
        raise ShardError(
            path,
            0,
            f"HDF5 dataset {name!r} is {ds.shape} {ds.dtype}, but the file records {shape} of kind {kind!r} "
            f"within {max_bytes} bytes: the file is damaged",
        )
    return ds


def _hdf5_meta(h5, path: Path) -> tuple[int, tuple[str, ...]]:
    """The sample count and field names the writer recorded in the ``meta`` dataset, checked."""
    from tricks_lib.data.tar_format import ShardError

    meta = h5.get("meta")
    if meta is None or not hasattr(meta, "dtype") or meta.dtype != np.uint8 or len(meta.shape) != 1:
        raise ShardError(path, 0, "not an HDF5 file of write_hdf5's layout (no 'meta' dataset): rewrite it")
    if meta.shape[0] > _HDF5_META_LIMIT:
        raise ShardError(path, 0, f"HDF5 'meta' dataset of {meta.shape[0]} bytes: damaged")
    try:
        info = json.loads(meta[()].tobytes())
    except ValueError as err:
        raise ShardError(path, 0, f"HDF5 'meta' dataset is not JSON: damaged ({err})") from None
    if not isinstance(info, dict) or info.get("format") != _HDF5_FORMAT:
        raise ShardError(path, 0, f"not an HDF5 file of write_hdf5's layout ({_HDF5_FORMAT!r}): rewrite it")
    count, fields = info.get("count"), info.get("fields")
    if type(count) is not int or not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise ShardError(path, 0, "HDF5 'meta' dataset has no sample count or field names: damaged")
    return count, tuple(fields)


def _hdf5_error(path: Path, what: str, err: Exception):
    from tricks_lib.data.tar_format import ShardError

    return ShardError(path, 0, f"{what} failed, the file is damaged (a checksum or its structure): {err}")


class _Hdf5Handle:
    """An open HDF5 file and its fields' data datasets, kept open: HDF5's chunk cache (and the
    checksum of each chunk) belongs to an open dataset, so looking a dataset up per read would read
    and check its whole chunk again for every sample."""

    def __init__(self, path: Path, fields: tuple[str, ...]):
        import h5py

        self.file = h5py.File(path, "r")
        self.data = {f: self.file[f"fields/{f}/data"] for f in fields}

    def close(self) -> None:
        self.data = {}
        self.file.close()


class Hdf5Dataset(_PerProcessHandleDataset):
    """Read an HDF5 file made by :func:`write_hdf5` (file opened per process).

    At construction the stored shapes, types and sizes are checked against the count the writer
    recorded (and the file's size) and every field's offsets are read and checked (starting at 0,
    never decreasing, ending at the data's length), so each read is bounded; HDF5's checksums
    (metadata, and Fletcher-32 per data chunk) turn a flipped bit into an error.

    Raises:
        ShardError: a file not written by ``write_hdf5`` (or by its older layout), or a damaged one;
            at construction, or for a damaged chunk, on the read that meets it.
    """

    def __init__(self, path: str | os.PathLike, *, transform: Callable[[dict], object] | None = None):
        from tricks_lib.data.tar_format import ShardError

        super().__init__(path, transform)
        import h5py

        file_size = self.path.stat().st_size
        try:
            with h5py.File(self.path, "r") as h5:
                count, fields = _hdf5_meta(h5, self.path)
                if not 0 < count <= file_size:
                    raise ShardError(self.path, 0, f"HDF5 file records {count} samples in {file_size} bytes: damaged")
                keys = _checked_dataset(h5, "keys", self.path, (count,), "S", count * _HDF5_KEY_LIMIT)
                self.keys = [k.decode() for k in keys[()].tolist()]
                self._offsets = {}
                for f in fields:
                    name = f"fields/{f}"
                    offsets = _checked_dataset(h5, f"{name}/offsets", self.path, (count + 1,), "i", 8 * (count + 1))
                    offsets = offsets[()]
                    data = h5.get(f"{name}/data")
                    total = int(offsets[-1])
                    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or total > file_size:
                        raise ShardError(self.path, 0, f"HDF5 field {f!r} has inconsistent offsets: damaged")
                    _checked_dataset(h5, f"{name}/data", self.path, (total,), "u", total)
                    del data
                    self._offsets[f] = offsets.tolist()
        except OSError as err:  # h5py raises OSError (and KeyError) for what HDF5's checks refuse
            raise _hdf5_error(self.path, "opening the HDF5 file", err) from err
        except KeyError as err:
            raise _hdf5_error(self.path, "opening the HDF5 file", err) from err
        self.fields = fields

    def __len__(self) -> int:
        return len(self.keys)

    def _open(self):
        return _Hdf5Handle(self.path, self.fields)

    def __getitem__(self, i: int) -> object:
        handle = self._current_handle()
        sample = {"__key__": self.keys[i]}
        try:
            for f in self.fields:
                offsets = self._offsets[f]
                start, stop = offsets[i], offsets[i + 1]
                sample[f] = handle.data[f][start:stop].tobytes() if stop > start else b""
        except (OSError, KeyError) as err:
            raise _hdf5_error(self.path, f"reading sample {self.keys[i]!r}", err) from err
        return self._out(sample)


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


def write_pt(samples: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write samples into one ``torch.save`` file, atomically.

    Layout: ``{"keys": [str], "fields": {ext: (data, offsets)}}`` where ``data`` is one flat uint8
    tensor of all samples' bytes and ``offsets`` (int64, length N+1) marks where each starts, so
    ``torch.load(..., mmap=True)`` maps the file and a sample is a zero-copy slice.
    """
    samples, fields = _fields_and_list(samples)
    path = Path(path)
    payload = {"keys": [s["__key__"] for s in samples], "fields": {}}
    for f in fields:
        sizes = torch.tensor([0] + [len(s[f]) for s in samples], dtype=torch.int64)
        joined = bytearray(b"".join(bytes(s[f]) for s in samples))
        # torch.frombuffer refuses a zero-length buffer: a field that is empty in every sample
        data = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        payload["fields"][f] = (data, torch.cumsum(sizes, 0))
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


class PtDataset(_SampleDataset):
    """Read a file made by :func:`write_pt` with ``torch.load(weights_only=True, mmap=mmap)``."""

    def __init__(
        self, path: str | os.PathLike, *, mmap: bool = True, transform: Callable[[dict], object] | None = None
    ):
        super().__init__(path, transform)
        payload = torch.load(self.path, weights_only=True, mmap=mmap)
        self.keys, self._fields = payload["keys"], payload["fields"]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> object:
        sample = {"__key__": self.keys[i]}
        for f, (data, offsets) in self._fields.items():
            sample[f] = data[int(offsets[i]) : int(offsets[i + 1])].numpy().tobytes()
        return self._out(sample)


def write_npy(array: np.ndarray, path: str | os.PathLike) -> Path:
    """Save an array as ``.npy`` atomically; read it back with ``np.load(path, mmap_mode="r")``."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array must be a numpy array, got {type(array).__name__}")
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)
    return path
