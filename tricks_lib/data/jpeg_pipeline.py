"""A DataLoader JPEG pipeline that decodes whole batches in the workers, straight into shared memory.

Where the time of a usual JPEG DataLoader goes, besides decoding (measured on 2 cores, 256 px JPEGs;
``benchmarks/jpeg_pipeline.py``): the default collation stacks per-sample tensors (one more copy per
image), and every batch lands in a *fresh* shared-memory segment, so each 4 KiB page of it costs a
page fault (zero-fill) in the worker, plus an ``mmap``/``munmap`` pair and a file descriptor passed
through a socket per batch. Three steps remove that:

- :class:`JpegBatchDataset` decodes a whole batch per request, each image written by the decoder
  directly into its row of one preallocated ``(B, H, W, 3)`` uint8 tensor (no per-image array, no
  stacking), optionally pre-faulted in one ``madvise(MADV_POPULATE_WRITE)`` call.
- :class:`JpegLoader` runs it under a ``DataLoader`` (batch requests from its own sampler, one thread
  per worker, persistent workers) and, with ``reuse=True`` (opt-in), decodes into a ring of shared-memory
  batches that the main process allocated once: a worker then sends back only the slot number and
  the labels, and its pages are faulted once per run, not once per batch.
- The ring's contract is enforced, not documented only: a slot is handed to a worker again only when
  no tensor in the main process still refers to it (its storage's use count, views and
  ``.numpy()`` arrays included). A consumer that keeps batches gets fresh ones instead, never
  overwritten ones; ``counts()`` says how often that happened. What no count in this process can
  see is another process: a batch put on a ``torch.multiprocessing`` queue (a saver, a logger)
  travels as a handle to the same shared memory, and the ring would overwrite it before the
  receiver reads it. So the ring is opt-in (``reuse=True``), for loops that consume each batch in
  this process; send ``images.clone()`` to other processes.

Images come out channels last, ``(B, H, W, 3)`` uint8, as decoders write them;
``images.permute(0, 3, 1, 2)`` is a free ``(B, 3, H, W)`` view (``channels_last`` memory format).

The worker side (:class:`JpegBatchDataset`, ``prefault_pages``, ``limit_worker_threads``) is
:mod:`tricks_lib.data.jpeg_batches`; reading a comparison of pipelines against every core decoding
as fast as one is :mod:`tricks_lib.data.loader_efficiency`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.data.jpeg_batches import (
    BatchRequest,
    JpegBatchDataset,
    _shared_uint8,
    limit_worker_threads,
    prefault_pages,
)

__all__ = ["JpegLoader", "LoaderCounts"]


class _RingDecode(Dataset):
    """The loader's view of a dataset: decodes each request into a ring slot, or a fresh batch for slot -1."""

    def __init__(self, dataset: JpegBatchDataset, ring: list[torch.Tensor], fault_fresh: bool):
        self.dataset, self.ring, self.fault_fresh = dataset, ring, fault_fresh

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, request: BatchRequest):
        slot, indices = request
        # A numpy array is pickled into the message; a tensor would get a shared-memory segment of its own.
        labels = self.dataset.labels.numpy()[list(indices)]
        if slot >= 0:  # the worker sends back the slot number only; the main process holds the pixels
            self.dataset.decode_batch(indices, self.ring[slot])
            return slot, None, labels
        return slot, self.dataset.decode_batch(indices, self.dataset._fresh(len(indices), self.fault_fresh)), labels


def _keep(batch):
    return batch


def _use_count(tensor: torch.Tensor) -> int:
    # References to the storage from every tensor and array in this process (views, .numpy() included).
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


@dataclass(frozen=True)
class LoaderCounts:
    """Batches a :class:`JpegLoader` requested since it was built: into a reused ring slot, or fresh."""

    reused: int
    fresh: int

    def __repr__(self) -> str:
        return f"LoaderCounts(reused={self.reused}, fresh={self.fresh})"

    def _repr_markdown_(self) -> str:
        return f"| reused ring slots | fresh batches |\n|---|---|\n| {self.reused} | {self.fresh} |"


class _Requests:
    """The loader's sampler: each epoch's batches of indices, each with the ring slot to decode into."""

    def __init__(self, loader: JpegLoader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        loader = self.loader
        # Runs at the first request of an epoch: after the previous epoch's workers finished (persistent
        # workers are drained by DataLoader before it asks for indices; others were shut down).
        loader._in_flight.clear()
        for indices in loader.epoch_batches(loader.epoch):
            yield BatchRequest(loader._take_slot(), tuple(indices))


class JpegLoader:
    """Batches of decoded JPEGs from DataLoader workers: ``for images, labels in JpegLoader(ds, batch_size=64)``.

    Every epoch yields each sample exactly once, in order (``shuffle=False``) or in a permutation
    seeded by ``(seed, epoch)``; ``set_epoch(e)`` picks the epoch (persistent workers included: the
    order is drawn in the main process). Starting a new epoch ends the previous one's iteration.

    Args:
        dataset: a :class:`JpegBatchDataset`.
        batch_size: samples per batch; the last one is smaller unless ``drop_last``.
        shuffle, seed, drop_last: the epoch's order, as above.
        num_workers: DataLoader worker processes (0: decode in the main process).
        prefetch_factor: batches in flight per worker.
        persistent_workers: keep the workers between epochs (needs ``num_workers > 0``).
        reuse: decode into a ring of shared batches allocated once (``ring_slots`` of them); off by
            default. A slot is reused only once no tensor in this process still refers to it;
            otherwise a fresh batch is decoded, so keeping batches (``kept.append(images)``) is safe,
            just slower. Not tracked: other processes (a batch sent through a ``torch.multiprocessing``
            queue shares the slot's memory: send ``images.clone()``), raw pointers (``data_ptr()``,
            ctypes) and pinning a batch in place (``cudaHostRegister``) for an asynchronous copy; ``images.to("cuda")`` from this pageable memory has read the
            batch when it returns, and ``pin_memory()`` makes a copy. Shared memory used:
            ``ring_slots * batch_size * H * W * 3`` bytes.
        ring_slots: ring size (default ``num_workers * prefetch_factor + 2``: the batches in flight,
            the one the consumer holds and the one it is being replaced by).
        prefault: pre-fault fresh batches (``prefault_pages``): one system call instead of a fault per page.
    Raises:
        TypeError / ValueError: a wrong dataset type, bad sizes, ``persistent_workers`` without workers.
    """

    def __init__(
        self,
        dataset: JpegBatchDataset,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_workers: int = 2,
        prefetch_factor: int = 2,
        persistent_workers: bool = True,
        reuse: bool = False,
        ring_slots: int | None = None,
        prefault: bool = True,
    ):
        if not isinstance(dataset, JpegBatchDataset):
            raise TypeError(f"dataset must be a JpegBatchDataset, got {type(dataset).__name__}")
        check_positive(batch_size, "batch_size", allow_none=False, integer=True)
        check_non_negative_int(seed, "seed")
        check_non_negative_int(num_workers, "num_workers")
        check_positive(prefetch_factor, "prefetch_factor", allow_none=False, integer=True)
        check_positive(ring_slots, "ring_slots", integer=True)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("reuse", reuse), ("prefault", prefault)):
            check_flag(flag, name)
        check_flag(persistent_workers, "persistent_workers")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers=True needs num_workers > 0 (or pass persistent_workers=False)")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.drop_last, self.epoch = drop_last, 0
        slots = (ring_slots or num_workers * prefetch_factor + 2) if reuse else 0
        # One storage per slot (a shared ring tensor would make every slot look held while one is).
        self._ring = [prefault_pages(_shared_uint8((batch_size, *dataset.shape, 3))) for _ in range(slots)]
        self._idle_count = [_use_count(t) for t in self._ring]  # the ring's own references
        self._in_flight: set[int] = set()
        self._next_slot, self._reused, self._fresh, self._active = 0, 0, 0, None
        options = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
        self._loader = DataLoader(
            _RingDecode(dataset, self._ring, prefault),
            batch_size=None,
            sampler=_Requests(self),
            collate_fn=_keep,
            num_workers=num_workers,
            worker_init_fn=limit_worker_threads,
            **options,
        )

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __repr__(self) -> str:
        ring = f"ring of {len(self._ring)}" if self._ring else "fresh batches"
        return (
            f"JpegLoader({len(self)} batches of {self.batch_size}, {self._loader.num_workers} workers, {ring}, "
            f"epoch {self.epoch})"
        )

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on (with ``shuffle``)."""
        check_non_negative_int(epoch, "epoch")
        self.epoch = epoch

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The batches of sample indices of ``epoch``, as the loader yields them."""
        n = len(self.dataset)
        order = np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)
        stop = len(self) * self.batch_size if self.drop_last else n
        return [order[i : min(i + self.batch_size, stop)].tolist() for i in range(0, stop, self.batch_size)]

    def counts(self) -> LoaderCounts:
        """How many batches came from a reused ring slot and how many were decoded fresh."""
        return LoaderCounts(reused=self._reused, fresh=self._fresh)

    def _take_slot(self) -> int:
        """A ring slot nothing refers to and no worker is writing, or -1 (decode a fresh batch)."""
        for step in range(len(self._ring)):
            slot = (self._next_slot + step) % len(self._ring)
            if slot not in self._in_flight and _use_count(self._ring[slot]) == self._idle_count[slot]:
                self._next_slot = slot + 1
                self._in_flight.add(slot)
                self._reused += 1
                return slot
        self._fresh += 1
        return -1

    def __iter__(self):
        if self._active is not None:
            self._active.close()  # one epoch at a time: the ring is shared by all of them
        self._active = self._batches()
        return self._active

    def _batches(self):
        batches = iter(self._loader)
        try:
            for slot, images, labels in batches:
                labels = torch.from_numpy(labels)
                if slot >= 0:
                    images = self._ring[slot][: len(labels)]  # a view: counted by the slot's use count
                    self._in_flight.discard(slot)
                yield images, labels
        finally:
            del batches  # without persistent workers this shuts them down before another epoch starts
