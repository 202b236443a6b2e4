"""JPEG DataLoader pipelines against the ideal: one core's decode rate times the number of cores.

    python benchmarks/jpeg_pipeline.py [--quick]

1. Single-core decode rates of the same 256 px JPEGs (simplejpeg, OpenCV + BGR->RGB, PIL), in
   interleaved rounds (tricks_lib.compare).
2. One epoch per call from each pipeline, interleaved with the one-core decode and with two
   independent processes that only decode (the ceiling this machine allows right now): PIL per item
   with the default collation, simplejpeg per item, batches decoded in the workers into fresh
   shared memory (plain and pre-faulted), and into a reused ring (tricks_lib.data.jpeg_pipeline).
   Every pipeline is first checked to yield exactly the samples of a plain single-process decode.
   Efficiency = samples/s / (one-core simplejpeg rate x cores), from the same rounds. The best
   pipeline is then timed again, interleaved with the one-core decode only (as 01 reads its target).
3. Where the time goes: per image, CPU time and page faults of the main process and of the workers
   over epochs of each pipeline (read from /proc/<pid>/stat), and the CPU efficiency: one core's CPU
   time per image over the pipeline's (all processes), the share it would reach on idle cores.

Prints one JSON document, with the load average before and after.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

SIZE = 256  # side of the stored JPEGs, pixels
BATCH = 64  # samples per batch
BIG_BATCH = 256  # samples per batch of the last pipeline (01 uses this size in full mode)
WORKERS = 2  # DataLoader workers (this machine has 2 cores)


class PerItem(Dataset):
    """One sample per call, decoded by PIL or simplejpeg: the usual DataLoader set-up."""

    def __init__(self, jpegs, labels, decoder):
        self.jpegs, self.labels, self.decoder = jpegs, labels, decoder

    def __len__(self):
        return len(self.jpegs)

    def __getitem__(self, i):
        if self.decoder == "pil":
            with Image.open(io.BytesIO(self.jpegs[i])) as im:
                image = np.array(im.convert("RGB"))  # a writable copy, as torchvision's pil_to_tensor makes
        else:
            import simplejpeg

            image = simplejpeg.decode_jpeg(self.jpegs[i], colorspace="RGB")
        return torch.from_numpy(image), self.labels[i]


_POOL_DATA = None  # the dataset, inherited by the forked decode-only processes


def _decode_share(bounds):
    ds, out = _POOL_DATA, np.empty((SIZE, SIZE, 3), np.uint8)
    for i in range(*bounds):
        ds.decode_into(i, out)
    return bounds[1] - bounds[0]


def _proc_times(pid):
    """(minor page faults, CPU seconds) of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workers_of(loader):
    inner = getattr(loader, "_loader", loader)  # JpegLoader wraps a DataLoader
    iterator = getattr(inner, "_iterator", None)
    return [w.pid for w in getattr(iterator, "_workers", [])]


def profile_epochs(run, loader, n, epochs):
    """Per image: CPU microseconds and page faults of this process and of the loader's workers."""
    run()  # start (persistent) workers
    pids = {"main": [os.getpid()], "workers": _workers_of(loader) if loader is not None else []}
    before = {k: [_proc_times(p) for p in v] for k, v in pids.items()}
    start = time.perf_counter()
    for _ in range(epochs):
        run()
    n *= epochs
    out = {"wall_us_per_image": round((time.perf_counter() - start) / n * 1e6, 1)}
    for k, v in pids.items():
        after = [_proc_times(p) for p in v]
        faults = sum(a[0] - b[0] for a, b in zip(after, before[k]))
        cpu = sum(a[1] - b[1] for a, b in zip(after, before[k]))
        out[k] = {"cpu_us_per_image": round(cpu / n * 1e6, 1), "page_faults_per_image": round(faults / n, 1)}
    return out


def main(argv):
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    quick = "--quick" in argv
    os.environ.setdefault("TRICKS_QUICK", "1" if quick else "0")
    import cv2
    import simplejpeg

    from tricks_lib.comparing import Budget, compare
    from tricks_lib.data.images import encode_image, render_photos
    from tricks_lib.data.jpeg_batches import JpegBatchDataset, limit_worker_threads
    from tricks_lib.data.jpeg_pipeline import JpegLoader
    from tricks_lib.data.loader_efficiency import pipeline_efficiency
    from tricks_lib.env import describe

    global _POOL_DATA
    results = {"machine": describe().summary(), "load_average_before": os.getloadavg()}
    count = 256 if quick else 2048
    photos = render_photos(count, size=SIZE, seed=0)
    jpegs = [encode_image(im, "jpg") for im in photos.images]
    labels = [int(x) for x in photos.labels]
    ds = _POOL_DATA = JpegBatchDataset(jpegs, labels, shape=(SIZE, SIZE))
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    cv2.setNumThreads(1)

    def pil(b):
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(im.convert("RGB"))

    decoders = {
        "simplejpeg": lambda: [simplejpeg.decode_jpeg(b, colorspace="RGB") for b in jpegs],
        "OpenCV + BGR->RGB": lambda: [
            cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB) for b in jpegs
        ],
        "PIL": lambda: [pil(b) for b in jpegs],
    }
    rounds = 8 if quick else 15
    single = compare(decoders, baseline="simplejpeg", items=count, budget=Budget(min_rounds=rounds), label="one core")
    results["single_core_samples_per_s"] = {r.name: r.measurement.items_per_second for r in single.rows}

    batch = torch.empty((BATCH, SIZE, SIZE, 3), dtype=torch.uint8)

    def one_core():  # the pipelines' own decode (into a batch), on one core in this process
        for start in range(0, count, BATCH):
            ds.decode_batch(range(start, min(start + BATCH, count)), batch)
        return count

    pool = multiprocessing.get_context("fork").Pool(cores)
    shares = [(k * count // cores, (k + 1) * count // cores) for k in range(cores)]

    def independent():  # the ceiling: every core decodes its share, nothing sent back
        return sum(pool.map(_decode_share, shares))

    common = {"num_workers": WORKERS, "persistent_workers": True, "worker_init_fn": limit_worker_threads}
    loaders = {
        "PIL per item, default collate": DataLoader(PerItem(jpegs, labels, "pil"), batch_size=BATCH, **common),
        "simplejpeg per item, default collate": DataLoader(PerItem(jpegs, labels, "sj"), batch_size=BATCH, **common),
        "batched, fresh shared memory": JpegLoader(ds, batch_size=BATCH, reuse=False, prefault=False),
        "batched, fresh, pre-faulted": JpegLoader(ds, batch_size=BATCH, reuse=False, prefault=True),
        "batched, ring reuse (JpegLoader)": JpegLoader(ds, batch_size=BATCH, reuse=True),
        # Each batch costs the main process about 0.5 ms of CPU in the DataLoader's queues: fewer, larger batches.
        f"batched, ring reuse, {BIG_BATCH} per batch": JpegLoader(ds, batch_size=BIG_BATCH, reuse=True),
    }
    expected = torch.stack([ds[i][0] for i in range(count)])
    for name, loader in loaders.items():  # correctness first: same pixels, same labels, each sample once
        got = [(x.clone(), torch.as_tensor(y)) for x, y in loader]
        assert torch.equal(torch.cat([x for x, _ in got]), expected), name
        assert torch.cat([y for _, y in got]).tolist() == labels, name

    def epoch(loader):
        def run():
            n = 0
            for _, y in loader:
                n += len(y)
            return n

        return run

    variants = {"decode, 1 core": one_core, f"{cores} independent processes": independent}
    variants |= {name: epoch(loader) for name, loader in loaders.items()}
    pipelines = compare(
        variants,
        baseline="decode, 1 core",
        items=count,
        budget=Budget(min_rounds=rounds),
        progress=not quick,
        label="one epoch",
    )
    efficiency = pipeline_efficiency(pipelines, "decode, 1 core", cores=cores)
    results["pipelines"] = {
        name: {"samples_per_s": round(rate), "efficiency": round(eff, 3), "verdict": pipelines[name].verdict}
        for name, rate, eff in efficiency.rates
    }
    results["rounds"] = pipelines.rounds
    # The best pipeline again, interleaved with the one-core decode only: other pipelines in the same rounds
    # (above all those that create and free a shared-memory segment per batch) can lower its share.
    best = max(loaders, key=lambda name: efficiency[name])
    alone = compare(
        {"decode, 1 core": one_core, best: variants[best]},
        baseline="decode, 1 core",
        items=count,
        budget=Budget(min_rounds=rounds),
        label="the best pipeline, alone with the reference",
    )
    results["best_pipeline"] = {
        "name": best,
        "efficiency_among_pipelines": round(efficiency[best], 3),
        "efficiency_alone": round(pipeline_efficiency(alone, "decode, 1 core", cores=cores)[best], 3),
    }
    epochs = 1 if quick else 4  # CPU time is counted in 10 ms ticks: enough images for a fine reading
    results["profile_per_image"] = {"decode, 1 core": profile_epochs(one_core, None, count, epochs)}
    results["profile_per_image"] |= {
        name: profile_epochs(variants[name], loader, count, epochs) for name, loader in loaders.items()
    }
    # CPU time per image of one core decoding, over the CPU time per image that a pipeline spends in all
    # its processes: the share of the ideal it would reach on idle cores (less sensitive to other jobs).
    one = results["profile_per_image"]["decode, 1 core"]["main"]["cpu_us_per_image"]
    for name in loaders:
        spent = results["profile_per_image"][name]
        total = spent["main"]["cpu_us_per_image"] + spent["workers"]["cpu_us_per_image"]
        spent["cpu_efficiency"] = round(one / total, 3) if total else None
    results["ring_counts"] = repr(loaders["batched, ring reuse (JpegLoader)"].counts())
    pool.close()
    pool.join()
    del loaders
    results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
