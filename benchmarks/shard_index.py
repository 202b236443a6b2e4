"""TarShardDataset construction: index files beside the shards against reading every header.

    python benchmarks/shard_index.py [--quick]

Builds SHARDS shards of 1,000 samples (two fields each: a small payload and a label; construction
reads headers, not data, so the payload size barely matters) and times constructing the dataset in
interleaved rounds (tricks_lib.compare, order shuffled per round):

- "every header": ``index_files=False``, every header read and checked (the cost before index files);
- "index files": each shard's index from its index file, checked against the shard (warm cache);
- "index files missing": the index files deleted first, so construction reads every header and
  writes them again (the first construction after copying shards without them);
- where page-cache eviction is verified, the first two again with the shards and index files dropped
  from the page cache before each construction, next to a row that only drops.

A check comes first: every variant yields the same samples as were written. Construction time is
linear in the number of shards (each shard is indexed on its own), so the time for 1,000 shards of
1,000 samples is extrapolated as (median time per shard) x 1,000. Prints one JSON document with
the load average before and after; the numbers of a shared machine are noisy.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SAMPLES_PER_SHARD = 1000
TARGET_SHARDS = 1000  # the extrapolation: 1,000 shards of 1,000 samples


def make_samples(n: int) -> list[dict]:
    return [{"__key__": f"s{i:07d}", "bin": bytes([i % 256]) * 100, "cls": str(i % 10).encode()} for i in range(n)]


def main(argv: list[str]) -> int:
    from tricks_lib.comparing import Budget, compare
    from tricks_lib.data.cache import drop_from_page_cache, evict_from_page_cache
    from tricks_lib.data.shard_index_file import index_file_path
    from tricks_lib.data.shards import TarShardDataset, write_tar_shards

    quick = "--quick" in argv
    shards_count = 10 if quick else 50
    results = {"load_average_before": os.getloadavg(), "shards": shards_count, "samples_per_shard": SAMPLES_PER_SHARD}
    folder = Path(tempfile.mkdtemp(prefix="shard-index-bench-", dir=os.environ.get("DATA_ROOT")))
    try:
        samples = make_samples(shards_count * SAMPLES_PER_SHARD)
        paths = write_tar_shards(samples, folder, samples_per_shard=SAMPLES_PER_SHARD)
        sidecars = [index_file_path(p) for p in paths]

        def every_header():
            return TarShardDataset(paths, index_files=False)

        def index_files():
            return TarShardDataset(paths)

        def index_files_missing():
            for s in sidecars:
                s.unlink(missing_ok=True)
            return TarShardDataset(paths)

        expected = [s["__key__"] for s in samples]
        for build, source in ((every_header, "headers"), (index_files_missing, "headers"), (index_files, "index file")):
            ds = build()
            assert [ix.source for ix in ds.indexes] == [source] * len(paths), build.__name__
            assert [s["__key__"] for s in ds] == expected and list(ds)[-1] == samples[-1], build.__name__
        variants = {
            "every header": every_header,
            "index files": index_files,
            "index files missing (rebuilt and written)": index_files_missing,
        }
        eviction = evict_from_page_cache(paths + sidecars)
        results["cold_cache_verified"] = eviction.verified
        more_work = {}
        if eviction.verified:
            everything = paths + sidecars

            def cold(fn):
                def run():
                    drop_from_page_cache(everything)
                    return fn()

                return run

            variants["drop from page cache only"] = lambda: drop_from_page_cache(everything)
            variants["every header, cold cache"] = cold(every_header)
            variants["index files, cold cache"] = cold(index_files)
            more_work = {name: "drop from page cache only" for name in variants if name.endswith("cold cache")}
        cmp = compare(
            variants,
            baseline="every header",
            budget=Budget(min_run_time=0.3 if quick else 2.0),
            label=f"construct TarShardDataset over {shards_count} shards of {SAMPLES_PER_SHARD} samples",
            more_work=more_work,
        )
        rows = {}
        for r in cmp.rows:
            per_shard = r.measurement.median / shards_count
            rows[r.name] = {
                "median_seconds": r.measurement.median,
                "us_per_sample": per_shard / SAMPLES_PER_SHARD * 1e6,
                "extrapolated_seconds_for_1000_shards_of_1000": per_shard * TARGET_SHARDS,
                "vs_every_header": r.speedup,
                "interval": [r.ci_low, r.ci_high],
                "verdict": r.verdict,
            }
        results["rows"] = rows
        results["table"] = str(cmp)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
