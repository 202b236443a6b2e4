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

What the containers share lives here: the sample check every writer runs and the readers' base
classes; so do the formats without checks of their own (a folder of files, ``.pt``, ``.npy``). LMDB,
HDF5 and TFRecord, whose readers check a file before they trust it, have a module each:
``lmdb_container``, ``hdf5_container`` and ``tfrecord_container``.

LMDB and HDF5 handles are opened lazily in the process that reads (they must not cross a
``fork`` into DataLoader workers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from tricks_lib._atomic import atomic_path
from tricks_lib.data.images import FOLDER_MANIFEST, FOLDER_SET, folder_manifest
from tricks_lib.data.samples import check_samples
from tricks_lib.data.write_state import refuse_unfinished_write

__all__ = ["FolderDataset", "PtDataset", "write_npy", "write_pt"]


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
    """Samples stored as one file per field (``<key>.<ext>``) in a folder, read with ``open``.

    A folder that ``write_image_folder`` wrote is read as the set its last complete write listed: a
    write that stopped halfway, or files missing from that set or added beside it, are a ValueError
    (never a silent mix of two versions). Any other folder is read whole.
    """

    def __init__(self, root: str | os.PathLike, *, transform: Callable[[dict], object] | None = None):
        super().__init__(root, transform)
        refuse_unfinished_write(self.path, FOLDER_SET, "the files")
        groups: dict[str, dict[str, Path]] = {}
        found = [p for p in sorted(self.path.rglob("*")) if p.is_file() and not p.name.startswith(".")]
        listed = folder_manifest(self.path)
        if listed is not None:
            names = {p.relative_to(self.path).as_posix() for p in found}
            missing, extra = sorted(set(listed) - names), sorted(names - set(listed))
            if missing or extra:
                raise ValueError(
                    f"{self.path} is not the set write_image_folder last wrote: {len(missing)} of its files missing"
                    f"{f' (e.g. {missing[0]})' if missing else ''}, {len(extra)} other files beside them"
                    f"{f' (e.g. {extra[0]})' if extra else ''}; write the folder again, or delete "
                    f"{FOLDER_MANIFEST} to read whatever files it holds"
                )
        for p in found:
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
