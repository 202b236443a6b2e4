"""Tests for tricks_lib.data.containers: every container round-trips and writes atomically."""

import os

import numpy as np
import pytest
from torch.utils.data import DataLoader

from tricks_lib.data.containers import (FolderDataset, Hdf5Dataset, LmdbDataset, PtDataset,
                                        read_tfrecord, write_hdf5, write_lmdb, write_npy, write_pt,
                                        write_tfrecord)
from tricks_lib.data.images import write_image_folder


def make(n):
    return [{"__key__": f"k{i:03d}", "jpg": bytes([i % 256]) * (5 + 13 * i), "cls": str(i % 4).encode()}
            for i in range(n)]


READERS = {"lmdb": (write_lmdb, LmdbDataset), "h5": (write_hdf5, Hdf5Dataset), "pt": (write_pt, PtDataset)}


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_map_style_round_trip(tmp_path, fmt):
    write, Reader = READERS[fmt]
    samples = make(12)
    ds = Reader(write(samples, tmp_path / f"data.{fmt}"))
    assert len(ds) == 12 and [ds[i] for i in range(12)] == samples


@pytest.mark.parametrize("fmt", ["lmdb", "h5"])
def test_handles_are_opened_per_worker(tmp_path, fmt):
    write, Reader = READERS[fmt]
    samples = make(6)
    ds = Reader(write(samples, tmp_path / f"data.{fmt}"))
    ds[0]  # opens a handle in this process; workers must not inherit it
    got = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert sorted(s["__key__"] for s in got) == [s["__key__"] for s in samples]


def test_folder_and_tfrecord_round_trip(tmp_path):
    samples = make(7)
    write_image_folder(samples, tmp_path / "folder")
    assert [FolderDataset(tmp_path / "folder")[i] for i in range(7)] == samples
    assert list(read_tfrecord(write_tfrecord(samples, tmp_path / "d.tfrecord"), ["jpg", "cls"])) == samples


def test_pt_loads_with_mmap(tmp_path):
    ds = PtDataset(write_pt(make(3), tmp_path / "d.pt"), mmap=True)
    assert ds[2]["jpg"] == make(3)[2]["jpg"]


def test_npy_round_trip(tmp_path):
    arr = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    mm = np.load(write_npy(arr, tmp_path / "a.npy"), mmap_mode="r")
    assert isinstance(mm, np.memmap) and np.array_equal(mm, arr)


class Bomb(bytes):
    def __bytes__(self):
        raise RuntimeError("interrupted")


@pytest.mark.parametrize("write", [write_lmdb, write_hdf5, write_tfrecord, write_pt],
                         ids=lambda w: w.__name__)
def test_interrupted_write_leaves_nothing(tmp_path, write):
    samples = make(8)
    samples[5]["jpg"] = Bomb(b"x" * 10)
    with pytest.raises(RuntimeError, match="interrupted"):
        write(samples, tmp_path / "data.bin")
    assert os.listdir(tmp_path) == []


def test_writers_validate_samples(tmp_path):
    samples = make(3)
    del samples[1]["cls"]
    with pytest.raises(ValueError, match="same fields"):
        write_pt(samples, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="duplicate"):
        write_lmdb(make(2) + make(1), tmp_path / "x.lmdb")
    with pytest.raises(ValueError, match="empty"):
        write_hdf5([], tmp_path / "x.h5")
    with pytest.raises(TypeError, match="numpy"):
        write_npy([1, 2], tmp_path / "x.npy")


@pytest.mark.parametrize("fmt", ["lmdb", "h5"])
def test_close_releases_and_reopens(tmp_path, fmt):
    write, Reader = READERS[fmt]
    ds = Reader(write(make(3), tmp_path / f"data.{fmt}"))
    first = ds[1]
    ds.close()
    assert ds[1] == first
