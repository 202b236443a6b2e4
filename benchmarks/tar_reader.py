"""Tar shard readers on the same shards: TarShardDataset against webdataset and tarfile (issue 11, 12 and 15).

    python benchmarks/tar_reader.py [--quick]

Raw bytes, no decoding: the reader's own cost. Three parts, each after a check that every reader
returns the same samples, each timed in interleaved rounds (tricks_lib.compare, shuffled order
per round):

- warm page cache, samples of about 1 KiB, 18 KiB and 200 KiB: every reader in the main process;
  also building the index (construction, every header) per sample (benchmarks/shard_index.py times
  construction from index files);
- through a DataLoader with 2 persistent workers (start-up excluded: one warm-up epoch), 1 KiB and
  18 KiB: one sample per message from the workers against batches of 64 built in the workers
  (``collate_fn=list``), for both readers; fresh loaders per replicate;
- cold page cache (files dropped with posix_fadvise before every call, eviction verified with
  mincore once), 18 KiB and 200 KiB: the tar reader's read rate against ``f.read()`` of each whole
  shard after the same drop, the sequential-read reference.

Prints one JSON document: samples/s, ratios with their 99% intervals, the machine's load average
before and after.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np


def make_samples(n: int, size: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "__key__": f"s{i:06d}",
            "bin": rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
            "cls": str(i % 10).encode(),
        }
        for i in range(n)
    ]


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    quick = "--quick" in argv
    results = {"load_average_before": os.getloadavg(), "cases": []}
    for label, size, count in (("1 KiB", 1024, 4000), ("18 KiB", 18 * 1024, 1500), ("200 KiB", 200 * 1024, 200)):
        count = max(count // 10, 20) if quick else count
        results["cases"].append(run_case(label, size, count, quick))
    results["loader_cases"] = []
    for label, size, count in (("1 KiB", 1024, 4000), ("18 KiB", 18 * 1024, 1500)):
        count = max(count // 10, 2 * LOADER_BATCH) if quick else count
        results["loader_cases"].append(run_loader_case(label, size, count, quick))
    results["cold_cases"] = []
    for label, size, count in (("18 KiB", 18 * 1024, 1500), ("200 KiB", 200 * 1024, 400)):
        count = max(count // 10, 20) if quick else count
        results["cold_cases"].append(run_cold_case(label, size, count, quick))
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


def run_case(label: str, size: int, count: int, quick: bool) -> dict:
    """One sample size: check that the readers agree, then time them interleaved."""
    import webdataset as wds

    from tricks_lib.comparing import Budget, compare
    from tricks_lib.data import TarShardDataset, index_tar_shard, write_tar_shards

    samples = make_samples(count, size)
    folder = Path(tempfile.mkdtemp(prefix="tar-bench-"))
    shards = write_tar_shards(samples, folder, samples_per_shard=max(count // 4, 1))
    urls = [str(p) for p in shards]

    indexed = TarShardDataset(shards)

    def ours():  # indexed once, as a training run does (construction is timed apart, below)
        return [s["bin"] for s in indexed]

    def ours_with_index():  # construction (every header read and checked, no index file) plus the read
        return [s["bin"] for s in TarShardDataset(shards, index_files=False)]

    def theirs():
        return [s["bin"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]

    def plain_tarfile():
        out = []
        for p in shards:
            with tarfile.open(p) as tar:
                out += [tar.extractfile(m).read() for m in tar if m.name.endswith(".bin")]
        return out

    def read_whole_files():  # the sequential-read reference: every byte once, no parsing
        return [p.read_bytes() for p in shards]

    expected = [s["bin"] for s in samples]
    assert ours() == expected and ours_with_index() == expected
    assert theirs() == expected and plain_tarfile() == expected
    start = time.perf_counter()
    for p in shards:
        index_tar_shard(p)
    index_seconds = time.perf_counter() - start
    cmp = compare(
        {
            "webdataset": theirs,
            "TarShardDataset": ours,
            "TarShardDataset, index + read": ours_with_index,
            "tarfile": plain_tarfile,
            "f.read() of each shard": read_whole_files,
        },
        baseline="webdataset",
        items=count,
        budget=Budget(min_run_time=0.2 if quick else 2.0),
        label=f"{label} samples",
    )
    case = {
        "samples": label,
        "count": count,
        "index_us_per_sample": index_seconds / count * 1e6,
        "rows": {
            r.name: {
                "samples_per_second": r.measurement.items_per_second,
                "vs_webdataset": r.speedup,
                "interval": [r.ci_low, r.ci_high],
                "verdict": r.verdict,
            }
            for r in cmp.rows
        },
    }
    shutil.rmtree(folder)  # the shards and their index files
    return case


LOADER_BATCH = 64  # samples per worker message when batched in the workers
LOADER_WORKERS = 2


def _row_dict(r, reference_name: str) -> dict:
    return {
        "samples_per_second": r.measurement.items_per_second,
        f"vs_{reference_name}": r.speedup,
        "interval": [r.ci_low, r.ci_high],
        "verdict": r.verdict,
    }


def run_loader_case(label: str, size: int, count: int, quick: bool) -> dict:
    """Both readers through a DataLoader with 2 persistent workers: one sample per message vs batched."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    from tricks_lib.comparing import Budget, compare
    from tricks_lib.data import TarShardDataset, write_tar_shards

    samples = make_samples(count, size)
    folder = Path(tempfile.mkdtemp(prefix="tar-bench-loader-"))
    shards = write_tar_shards(samples, folder, samples_per_shard=max(count // 4, 1))  # 4 shards: 2 per worker
    urls = [str(p) for p in shards]
    readers = {
        "TarShardDataset": lambda: TarShardDataset(shards),
        "webdataset": lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False),
    }

    def loader(make_dataset, batched: bool) -> DataLoader:
        batching = {"batch_size": LOADER_BATCH, "collate_fn": list} if batched else {"batch_size": None}
        return DataLoader(make_dataset(), num_workers=LOADER_WORKERS, persistent_workers=True, **batching)

    def epoch_keys(dl: DataLoader, batched: bool) -> list[str]:
        return [s["__key__"] for batch in dl for s in batch] if batched else [s["__key__"] for s in dl]

    def epoch_count(dl: DataLoader, batched: bool) -> int:  # what is timed: the bytes arrive, are not copied
        return sum(len(batch) for batch in dl) if batched else sum(1 for _ in dl)

    expected = sorted(s["__key__"] for s in samples)
    for reader, make in readers.items():  # same samples, exactly once, either way
        for batched in (False, True):
            got = epoch_keys(loader(make, batched), batched)
            assert sorted(got) == expected, (reader, batched, len(got))

    def variants() -> dict:  # fresh loaders (new workers) per replicate
        out = {}
        for reader, make in readers.items():
            for batched in (False, True):
                dl = loader(make, batched)
                name = f"{reader}, {'batched in workers' if batched else 'one sample per message'}"
                out[name] = lambda dl=dl, batched=batched: epoch_count(dl, batched)
        return out

    baseline = "TarShardDataset, one sample per message"
    cmp = compare(
        variants,
        baseline=baseline,
        items=count,
        replicates=2 if quick else 3,
        budget=Budget(min_run_time=0.2 if quick else 2.0),
        label=f"{label} samples, DataLoader with {LOADER_WORKERS} workers",
    )
    ours, theirs = "TarShardDataset, batched in workers", "webdataset, batched in workers"
    single = cmp[baseline].measurement.median
    batched = cmp[ours].measurement.median
    case = {
        "samples": label,
        "count": count,
        "per_message": LOADER_BATCH,
        "rows": {r.name: _row_dict(r, "one_sample_per_message") for r in cmp.rows},
        "TarShardDataset_vs_webdataset_batched": _row_dict(cmp.versus(ours, theirs), "webdataset"),
        "inter_process_us_per_sample": (single - batched) / count * 1e6,  # from medians
    }
    del cmp
    gc.collect()  # the loaders' workers shut down with the loaders
    shutil.rmtree(folder)
    case["workers_left_running"] = len(multiprocessing.active_children())
    return case


def run_cold_case(label: str, size: int, count: int, quick: bool) -> dict:
    """Cold page cache: the tar reader against f.read() of each whole shard, both after the same drop."""
    from tricks_lib.comparing import Budget, compare
    from tricks_lib.data import TarShardDataset, drop_from_page_cache, evict_from_page_cache, write_tar_shards

    samples = make_samples(count, size)
    folder = Path(tempfile.mkdtemp(prefix="tar-bench-cold-"))
    shards = write_tar_shards(samples, folder, samples_per_shard=max(count // 4, 1))
    shard_bytes = sum(p.stat().st_size for p in shards)
    eviction = evict_from_page_cache(shards)  # writes the new shards back once, so later drops are cheap
    if not eviction.verified:
        shutil.rmtree(folder)
        return {"samples": label, "skipped": f"eviction not verified ({eviction.after.method}) under {folder.parent}"}
    indexed = TarShardDataset(shards)
    expected = [s["bin"] for s in samples]
    assert [s["bin"] for s in indexed] == expected

    def cold(fn):
        def run():
            drop_from_page_cache(shards)
            return fn()

        return run

    def read_whole_shards() -> int:  # the sequential-read bandwidth reference
        total = 0
        for p in shards:
            with open(p, "rb") as f:
                total += len(f.read())
        return total

    assert read_whole_shards() == shard_bytes
    reference, drop_only = "f.read() of each shard", "drop from cache only"
    cmp = compare(
        {
            reference: cold(read_whole_shards),
            "TarShardDataset": cold(lambda: sum(len(s["bin"]) for s in indexed)),
            drop_only: lambda: drop_from_page_cache(shards),
        },
        baseline=reference,
        items=count,
        more_work={reference: drop_only, "TarShardDataset": drop_only},
        budget=Budget(min_run_time=0.2 if quick else 2.0),
        label=f"{label} samples, cold page cache",
    )
    ours = cmp["TarShardDataset"]
    case = {
        "samples": label,
        "count": count,
        "shard_bytes": shard_bytes,
        "drop_seconds": cmp[drop_only].measurement.median,
        "rows": {r.name: _row_dict(r, "f_read") for r in cmp.rows},
        "read_MB_per_s": {
            name: shard_bytes / cmp[name].measurement.median / 1e6 for name in (reference, "TarShardDataset")
        },
        # f.read() time over the reader's time, paired per round: 1.0 = at the sequential bandwidth
        "TarShardDataset_share_of_f_read_bandwidth": ours.speedup,
        "within_10_percent": ours.speedup >= 1 / 1.1,  # the reader's time at most 1.1x f.read()'s
    }
    shutil.rmtree(folder)
    return case


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
