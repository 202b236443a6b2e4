"""Tar shard readers on the same shards, warm page cache: TarShardDataset against webdataset and tarfile.

    python benchmarks/tar_reader.py [--quick]

Raw bytes, no decoding: the reader's own cost. For samples of about 1 KiB, 18 KiB and 200 KiB,
every reader reads the same shards in interleaved rounds (tricks_lib.bench.compare, shuffled order
per round), after a check that all of them return the same samples. Also times building the index
(construction, every header) per sample; benchmarks/shard_index.py times construction from index files. Prints one JSON document: samples/s, ratios with their 99% intervals,
the machine's load average before and after.
"""

from __future__ import annotations

import json
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
    quick = "--quick" in argv
    results = {"load_average_before": os.getloadavg(), "cases": []}
    for label, size, count in (("1 KiB", 1024, 4000), ("18 KiB", 18 * 1024, 1500), ("200 KiB", 200 * 1024, 200)):
        count = max(count // 10, 20) if quick else count
        results["cases"].append(run_case(label, size, count, quick))
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


def run_case(label: str, size: int, count: int, quick: bool) -> dict:
    """One sample size: check that the readers agree, then time them interleaved."""
    import webdataset as wds

    from tricks_lib.bench import compare
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
        min_run_time=0.2 if quick else 2.0,
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
