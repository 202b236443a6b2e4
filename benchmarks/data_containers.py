"""Every container of notebook 01 on the same JPEG samples, warm and cold page cache.

    python benchmarks/data_containers.py [--quick] [--root FOLDER] [--images N]

01 compares a folder of files with tar shards and LMDB; this script adds the rest, each read back to
exactly the samples that were written before anything is timed:

- a folder of files (the baseline), tar shards read by ``TarShardDataset``, by ``webdataset`` and by
  plain ``tarfile``, LMDB, HDF5 (h5py), TFRecord (the ``tfrecord`` package), one ``.pt`` file
  (``torch.load(weights_only=True, mmap=True)``) and a ``.npy`` memory map of the *decoded* pixels
  (several times the JPEG bytes, but no decode);
- timed in interleaved rounds (tricks_lib.compare, order shuffled per round) with a warm page cache,
  then, where eviction from the page cache can be verified (``posix_fadvise`` then ``mincore``; not
  on tmpfs), with every file dropped before each read, next to a row that only drops.

``--root`` puts the data on the storage you want to measure (default: the system temp folder).
Prints one JSON document: each reader's samples/s and verdict against the folder, warm and cold, the
file sizes, and the machine's load average before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np


def parse(argv: list[str]) -> dict:
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        sys.exit(0)
    options = {"quick": "--quick" in argv, "root": None, "images": None}
    for flag, key, kind in (("--root", "root", str), ("--images", "images", int)):
        if flag in argv:
            options[key] = kind(argv[argv.index(flag) + 1])
    return options


def main(argv: list[str]) -> int:
    import webdataset as wds

    from tricks_lib.comparing import compare
    from tricks_lib.data import (
        FolderDataset,
        Hdf5Dataset,
        LmdbDataset,
        PtDataset,
        TarShardDataset,
        drop_from_page_cache,
        evict_from_page_cache,
        make_samples,
        read_tfrecord,
        render_photos,
        write_hdf5,
        write_image_folder,
        write_lmdb,
        write_npy,
        write_pt,
        write_tar_shards,
        write_tfrecord,
    )

    options = parse(argv)
    count = options["images"] or (160 if options["quick"] else 2000)
    size = 128 if options["quick"] else 256
    results = {"load_average_before": os.getloadavg(), "images": count, "image_size": size}
    photos = render_photos(count, size=size, seed=0)
    samples = make_samples(photos, fmt="jpg")
    root = Path(tempfile.mkdtemp(prefix="tricks-containers-", dir=options["root"]))
    try:
        written = {
            "folder of files": write_image_folder(samples, root / "folder"),
            "tar shards": write_tar_shards(samples, root / "shards", samples_per_shard=max(count // 8, 1)),
            "LMDB": [write_lmdb(samples, root / "data.lmdb")],
            "HDF5": [write_hdf5(samples, root / "data.h5")],
            "TFRecord": [write_tfrecord(samples, root / "data.tfrecord")],
            ".pt file": [write_pt(samples, root / "data.pt")],
            ".npy (decoded pixels)": [write_npy(photos.images, root / "images.npy")],
        }
        results["bytes"] = {name: sum(p.stat().st_size for p in files) for name, files in written.items()}
        shards = written["tar shards"]
        folder_ds, shard_ds = FolderDataset(root / "folder"), TarShardDataset(shards)

        def read_map_style(ds):
            return [(s["__key__"], s["jpg"]) for s in (ds[i] for i in range(len(ds)))]

        def read_iterable(samples_iter):
            return [(s["__key__"], s["jpg"]) for s in samples_iter]

        def read_opened(reader_class, path):
            ds = reader_class(path)  # opened per read, so no mapping survives to keep pages cached
            try:
                return read_map_style(ds)
            finally:
                getattr(ds, "close", lambda: None)()

        def read_with_tarfile():
            out = []
            for path in shards:
                with tarfile.open(path, "r|") as tar:
                    out += [(m.name[:-4], tar.extractfile(m).read()) for m in tar if m.name.endswith(".jpg")]
            return out

        readers = {
            "folder of files": lambda: read_map_style(folder_ds),
            "tar (TarShardDataset)": lambda: read_iterable(shard_ds),
            "tar (webdataset)": lambda: read_iterable(
                wds.WebDataset([str(p) for p in shards], shardshuffle=False, empty_check=False)
            ),
            "tar (tarfile)": read_with_tarfile,
            "LMDB": lambda: read_opened(LmdbDataset, root / "data.lmdb"),
            "HDF5": lambda: read_opened(Hdf5Dataset, root / "data.h5"),
            "TFRecord": lambda: read_iterable(read_tfrecord(root / "data.tfrecord", ["jpg", "cls"])),
            ".pt (mmap)": lambda: read_opened(PtDataset, root / "data.pt"),
            ".npy memmap (decoded)": lambda: np.array(np.load(root / "images.npy", mmap_mode="r")),
        }
        expected = [(s["__key__"], s["jpg"]) for s in samples]
        for name, fn in readers.items():  # the check comes first: every reader returns what was written
            got = fn()
            assert np.array_equal(got, photos.images) if name.startswith(".npy") else got == expected, name
        all_files = [p for files in written.values() for p in files]
        warm = compare(readers, baseline="folder of files", items=count, label="containers, warm cache")
        results["warm"] = _rows(warm)
        eviction = evict_from_page_cache(all_files)
        results["cold_verified"] = eviction.verified
        if eviction.verified:
            drop_only = "drop from cache only"

            def cold(fn):
                def run():
                    drop_from_page_cache(all_files)
                    return fn()

                return run

            cold_readers = {drop_only: lambda: drop_from_page_cache(all_files)}
            cold_readers |= {name: cold(fn) for name, fn in readers.items()}
            cold_cmp = compare(
                lambda: cold_readers,
                replicates=3,
                baseline="folder of files",
                items=count,
                label="containers, cold cache",
                more_work=dict.fromkeys(readers, drop_only),
            )
            results["cold"] = _rows(cold_cmp)
    finally:
        shutil.rmtree(root)
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


def _rows(comparison) -> dict:
    return {
        r.name: {"samples_per_second": r.measurement.items_per_second, "verdict": r.verdict} for r in comparison.rows
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
