"""HDF5 (h5py) as a one-file container: :func:`write_hdf5`, whose layout carries a checksum on every
byte read (why this layout: its docstring), and :class:`Hdf5Dataset`, which checks every stored shape
and offset before it reads. The sample check and the reader base are shared:
:mod:`tricks_lib.data.containers`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from tricks_lib._atomic import atomic_path
from tricks_lib.data.containers import _fields_and_list, _PerProcessHandleDataset

__all__ = ["Hdf5Dataset", "write_hdf5"]

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
    _check_free_space(path, keys.nbytes + sum(len(s[f]) + 16 for s in samples for f in fields))
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


_HDF5_OVERHEAD = 1.05  # chunk indexes, checksums and headers: a few percent of the data, plus the fixed part below


def _check_free_space(path: Path, data_bytes: int) -> None:
    """Refuse to start a write the disk cannot hold (h5py dies with SIGSEGV on ENOSPC mid-write)."""
    folder = path.parent if path.parent.exists() else Path(".")
    needed = int(data_bytes * _HDF5_OVERHEAD) + 2**20
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"{folder} has {free / 2**20:.1f} MiB free and the HDF5 file needs about {needed / 2**20:.1f} MiB; "
            "free some space or write it elsewhere",
            str(path),
        )


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
