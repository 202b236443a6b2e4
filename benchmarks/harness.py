"""Benchmarks of the harness itself (reported in release notes, not asserted in tests).

    python benchmarks/harness.py

1. Overhead per call of a no-op inside a timed block, and per timed block (one sync + clock pair).
2. Agreement of `measure`'s median with `torch.utils.benchmark.Timer.blocked_autorange` on the same
   workloads, measured alternately so that machine drift hits both alike.
"""

import json
import statistics

import torch
from torch.utils.benchmark import Timer

from tricks_lib.env import describe, pick_device
from tricks_lib.timed_blocks import make_timer, run_block
from tricks_lib.timing import measure


def overhead():
    device = pick_device()
    per_call = measure(lambda: None, label="no-op", min_run_time=0.5).median
    timer = make_timer(lambda: None, device, "no-op")
    per_block = statistics.median(run_block(timer, 1) for _ in range(2000))
    return {"per_call_s": per_call, "per_block_s": per_block}


def agreement(repeats=5):
    n = 512
    a = torch.randn(n, n, device=pick_device())
    x = torch.randn(1 << 20, device=pick_device())
    workloads = {"matmul 512": lambda: a @ a, "gelu 1M": lambda: torch.nn.functional.gelu(x)}
    out = {}
    for name, fn in workloads.items():
        ours, theirs = [], []
        for _ in range(repeats):
            ours.append(measure(fn, min_run_time=0.5).median)
            ref = Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
            theirs.append(ref.blocked_autorange(min_run_time=0.5).median)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        out[name] = {"measure_median_s": mo, "blocked_autorange_median_s": mt, "relative_difference": abs(mo - mt) / mt}
    return out


if __name__ == "__main__":
    print(json.dumps({"machine": describe().summary(), "overhead": overhead(), "agreement": agreement()}, indent=2))
