"""LMDB as a one-file container: :func:`write_lmdb`, and :class:`LmdbDataset`, which checks the file
against its own meta pages (``check_lmdb_file``) before LMDB maps it, so a truncated file is an error,
not a SIGBUS. The sample check and the reader base are shared: :mod:`tricks_lib.data.containers`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from tricks_lib._atomic import atomic_path
from tricks_lib.data.containers import _fields_and_list, _PerProcessHandleDataset

__all__ = ["LmdbDataset", "write_lmdb"]


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
