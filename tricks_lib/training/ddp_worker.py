"""DistributedDataParallel training, one rank: the torchrun entry point that ``launch_ddp`` starts.

Under torchrun each process runs ``main()``: it joins the process group (``gloo`` on CPU, ``nccl``
on GPUs), builds a ``SmallCNN`` from a *different* seed per rank (so identical final parameters
prove that DDP's initial broadcast and gradient all-reduce work), trains it on its own synthetic data
shard with ``TrainStep`` (gradient accumulation runs the first micro-batches in ``no_sync()``, or,
with ``--sync-every-micro-batch``, all-reduces after every one: the baseline ``no_sync`` is measured
against), then gathers every rank's parameters on rank 0. A DDP communication hook counts the gradient
all-reduces, so the result shows that ``no_sync()`` skipped them on all but the last micro-batch.
Step times are taken like ``tricks_lib.measure`` does: untimed warm-up steps, a device sync
around every step, and median and IQR of the per-step times. Rank 0 writes a JSON file (a
``DDPResult``, module ``ddp``); nothing is parsed from prints.

    python -m torch.distributed.run --nproc-per-node 2 -m tricks_lib.training.ddp_worker --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tricks_lib.training.ddp import DDPResult

__all__: list[str] = []  # a script (``python -m``): its ``main`` is what each rank runs

_BATCHES = 4  # synthetic batches per rank, reused round-robin


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tricks_lib.training.ddp_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes the result to")
    p.add_argument("--backend", default=None, help="gloo or nccl (default: nccl with CUDA, else gloo)")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per optimizer step")
    p.add_argument("--accumulation-steps", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument(
        "--sync-every-micro-batch", action="store_true",
        help="all-reduce after every micro-batch (no no_sync()): the baseline for no_sync",
    )  # fmt: skip
    p.add_argument("--width", type=int, default=16, help="SmallCNN width")
    p.add_argument("--image-size", type=int, default=32, help="height and width of the synthetic images")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="base seed; rank r uses seed + r")
    p.add_argument("--progress-file", default=None, help="rank 0 writes the steps done so far here")
    return p.parse_args(argv)


def _rank_device(backend: str) -> torch.device:
    """This rank's device: under nccl its local GPU (made the current one), else the CPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _counted_ddp(model: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, list[int]]:
    """``model`` wrapped in DDP, and the list its comm hook appends each all-reduced bucket's index to."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # Count the all-reduces: DDP calls the hook once per gradient bucket on every backward that syncs.
    bucket_ids: list[int] = []

    def counting_allreduce(state, bucket):
        bucket_ids.append(bucket.index())
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_allreduce)  # state None = the default process group
    return ddp_model, bucket_ids


def _data_shard(args: argparse.Namespace, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's own synthetic images ``(_BATCHES, batch, 3, H, W)`` and labels ``(_BATCHES, batch)``.

    Each rank its own data shard (different seed), as a DistributedSampler would give it.
    """
    gen = torch.Generator().manual_seed(10_000 + args.seed + rank)
    shape = (_BATCHES, args.batch_size, 3, args.image_size, args.image_size)
    images = torch.randn(shape, generator=gen).to(device)
    labels = torch.randint(0, 10, (_BATCHES, args.batch_size), generator=gen).to(device)
    return images, labels


def _timed_steps(
    args: argparse.Namespace,
    rank: int,
    device: torch.device,
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    bucket_ids: list[int],
) -> tuple[list[float], torch.Tensor]:
    """Warm-up steps, then the timed ones: each step's seconds and the last step's loss.

    ``bucket_ids`` is cleared after the warm-up, so it holds the timed steps' all-reduces only.
    """
    import torch.distributed as dist

    images, labels = data

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def report(done: int) -> None:  # outside the timed region: the launcher's progress bar reads it
        if rank == 0 and args.progress_file:
            Path(args.progress_file).write_text(str(done))

    for i in range(args.warmup_steps):
        step(images[i % _BATCHES], labels[i % _BATCHES])
        report(i + 1)
    sync()
    bucket_ids.clear()  # count the timed steps only
    times, loss = [], torch.zeros((), device=device)
    for i in range(args.steps):
        dist.barrier()  # every rank starts the step together: one step's time, not a drift
        t0 = time.perf_counter()
        loss = step(images[i % _BATCHES], labels[i % _BATCHES])
        sync()  # a CUDA step is done when the device is done
        times.append(time.perf_counter() - t0)
        report(args.warmup_steps + i + 1)
    return times, loss


def _write_result(
    args: argparse.Namespace,
    backend: str,
    device: torch.device,
    times: list[float],
    loss: torch.Tensor,
    parameters: tuple[torch.Tensor, list[torch.Tensor]],
    bucket_ids: list[int],
) -> None:
    """Rank 0: the ``DDPResult`` as JSON at ``args.out``, written atomically (a reader never sees half a file).

    ``loss`` is summed over ranks; ``parameters`` is rank 0's flat parameters and every rank's, gathered.
    """
    flat, gathered = parameters
    world = len(gathered)
    result = DDPResult(
        world_size=world,
        backend=backend,
        device=device.type,
        batch_size=args.batch_size,
        accumulation_steps=args.accumulation_steps,
        steps=args.steps,
        step_times=tuple(times),
        samples_per_second=world * args.batch_size / max(float(np.median(times)), 1e-12),
        final_loss=float(loss) / world,
        num_parameters=flat.numel(),
        params_identical=all(torch.equal(g, flat) for g in gathered),
        max_param_difference=max(float((g - flat).abs().max()) for g in gathered),
        threads_per_process=torch.get_num_threads(),
        allreduce_calls=len(bucket_ids),
        buckets=len(set(bucket_ids)),  # DDP may rebuild its buckets after the first step: count them here
        backward_passes=args.steps * args.accumulation_steps,
        warmup_steps=args.warmup_steps,
        no_sync=not args.sync_every_micro_batch,
    )
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result)))
    os.replace(tmp, args.out)  # atomic: a reader never sees half a file


def main(argv: list[str] | None = None) -> None:
    """Entry point for one torchrun process (reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* from the env)."""
    import torch.distributed as dist

    from tricks_lib.training.models import SmallCNN
    from tricks_lib.training.steps import make_train_step

    args = _parse_args(argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = _rank_device(backend)
        # Different initial weights per rank: DDP must broadcast rank 0's at construction.
        torch.manual_seed(args.seed + rank)
        model = SmallCNN(10, width=args.width).to(device)
        ddp_model, bucket_ids = _counted_ddp(model, device)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
        step = make_train_step(
            ddp_model, optimizer, device=device, accumulation_steps=args.accumulation_steps,
            no_sync=not args.sync_every_micro_batch,
        )  # fmt: skip
        data = _data_shard(args, rank, device)
        times, loss = _timed_steps(args, rank, device, step, data, bucket_ids)
        bucket_ids = list(bucket_ids)  # the timed steps' all-reduces, before anything else communicates
        dist.all_reduce(loss)  # sum over ranks
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # (num_parameters,)
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        if rank == 0:
            _write_result(args, backend, device, times, loss, (flat, gathered), bucket_ids)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The result file is written and the process group destroyed. Skip interpreter teardown: with
    # gloo, C++ worker threads can still be joinable when static objects are destroyed, which aborts
    # a finished run now and then ("terminate called without an active exception", SIGABRT).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
