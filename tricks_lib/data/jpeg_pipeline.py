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
  per worker, persistent workers) and, with ``reuse=True``, decodes into a ring of shared-memory
  batches that the main process allocated once: a worker then sends back only the slot number and
  the labels, and its pages are faulted once per run, not once per batch.
- The ring's contract is enforced, not documented only: a slot is handed to a worker again only when
  no tensor in the main process still refers to it (its storage's use count, views and
  ``.numpy()`` arrays included). A consumer that keeps batches gets fresh ones instead, never
  overwritten ones; ``counts()`` says how often that happened.

Images come out channels last, ``(B, H, W, 3)`` uint8, as decoders write them;
``images.permute(0, 3, 1, 2)`` is a free ``(B, 3, H, W)`` view (``channels_last`` memory format).
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.formatting import html_table, markdown_table
from tricks_lib.measurements import Comparison

__all__ = [
    "JPEG_DECODERS",
    "BatchRequest",
    "JpegBatchDataset",
    "JpegLoader",
    "LoaderCounts",
    "PipelineEfficiency",
    "limit_worker_threads",
    "pipeline_efficiency",
    "prefault_pages",
]

JPEG_DECODERS = ("simplejpeg", "opencv", "pil")
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault in (and zero) a whole range in one call
_PAGE = 4096


def limit_worker_threads(worker_id: int = 0) -> None:
    """A ``worker_init_fn``: one thread per worker for torch and OpenCV, so workers do not oversubscribe.

    Each DataLoader worker is a process of its own; with torch's and OpenCV's default thread pools,
    ``num_workers`` processes each start one thread per core and fight for the same cores.
    """
    torch.set_num_threads(1)
    if "cv2" in sys.modules:
        sys.modules["cv2"].setNumThreads(1)


@functools.cache
def _madvise():
    """libc's madvise on Linux (looked up once: a dlopen per batch would cost more than it saves), else None."""
    if not sys.platform.startswith("linux"):
        return None
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def prefault_pages(tensor: torch.Tensor) -> torch.Tensor:
    """Fault in every page of a CPU tensor's storage now, in one system call; returns ``tensor``.

    A fresh buffer costs one page fault per 4 KiB page at first write (a ``(64, 256, 256, 3)`` batch:
    3,072 of them). ``madvise(MADV_POPULATE_WRITE)`` does the same work without a trap per page;
    where the kernel lacks it (before Linux 5.14, or not Linux), one byte per page is written instead.
    The contents are left as they were.

    Raises:
        TypeError: ``tensor`` is not a CPU tensor.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        raise TypeError(f"tensor must be a CPU tensor, got {type(tensor).__name__}")
    storage = tensor.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    if size == 0:
        return tensor
    aligned = start - start % _PAGE
    madvise = _madvise()
    if madvise is not None and madvise(aligned, size + start - aligned, _MADV_POPULATE_WRITE) == 0:
        return tensor
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)  # every byte of the storage, viewed as uint8
    flat[::_PAGE].copy_(flat[::_PAGE].clone())  # rewrite one byte per page with its own value
    return tensor


class BatchRequest(NamedTuple):
    """What the loader's sampler sends a worker: decode ``indices`` into ring slot ``slot`` (-1: a fresh batch)."""

    slot: int
    indices: tuple[int, ...]


def _shared_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized uint8 tensor in shared memory (as the default collate builds batches in a worker)."""
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


class JpegBatchDataset(Dataset):
    """JPEG bytes and labels; ``ds[i]`` decodes one image, ``ds[[i, j, ...]]`` a whole batch.

    The bytes are kept in one flat array plus offsets, not a list of ``bytes`` objects: forked
    workers then share them without touching thousands of reference counts (which would copy the
    pages on write), and spawned workers unpickle one array.

    Args:
        jpegs: one bytes-like JPEG per sample.
        labels: one integer label per sample.
        shape: ``(height, width)`` every image decodes to; a batch is one ``(B, H, W, 3)`` tensor.
        decoder: "simplejpeg" (libjpeg-turbo, writes into the batch directly), "opencv" (BGR decode,
            then converted into the batch) or "pil" (decoded, then copied).
    Indexing:
        ``ds[i]``: ``(image, label)``, a ``(H, W, 3)`` uint8 tensor and an int.
        ``ds[list_of_indices]``: ``(images, labels)``, ``(B, H, W, 3)`` uint8 and ``(B,)`` int64; the
        batch is in shared memory inside a DataLoader worker (so sending it copies nothing).
        ``ds[BatchRequest(...)]``: used by :class:`JpegLoader`.
    Raises:
        TypeError / ValueError: mismatched lengths, a bad shape or decoder; at decode time a
        ValueError names the sample whose image is not ``shape``.
    """

    def __init__(self, jpegs: Sequence, labels: Sequence[int], *, shape: tuple[int, int], decoder: str = "simplejpeg"):
        if not isinstance(jpegs, Sequence) or not isinstance(labels, Sequence | np.ndarray | torch.Tensor):
            raise TypeError("jpegs and labels must be sequences (one JPEG and one label per sample)")
        if len(jpegs) != len(labels) or not len(jpegs):
            raise ValueError(f"need one label per JPEG and at least one sample, got {len(jpegs)} and {len(labels)}")
        if not (isinstance(shape, tuple) and len(shape) == 2):
            raise TypeError(f"shape must be a (height, width) tuple, got {shape!r}")
        for side in shape:
            check_positive(side, "shape", allow_none=False, integer=True)
        if decoder not in JPEG_DECODERS:
            raise ValueError(f"decoder must be one of {JPEG_DECODERS}, got {decoder!r}")
        sizes = np.fromiter((len(b) for b in jpegs), dtype=np.int64, count=len(jpegs))
        self.offsets = np.concatenate(([0], np.cumsum(sizes)))  # (N + 1,): sample i is blob[off[i]:off[i+1]]
        self.blob = np.frombuffer(b"".join(bytes(b) for b in jpegs), dtype=np.uint8)
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        self.shape, self.decoder = shape, decoder

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        h, w = self.shape
        return f"JpegBatchDataset({len(self)} JPEGs of {h}x{w}, {self.blob.nbytes / 2**20:.1f} MiB, {self.decoder})"

    def decode_into(self, index: int, out: np.ndarray) -> None:
        """Decode sample ``index`` into ``out``, a writable ``(H, W, 3)`` uint8 array.

        Raises:
            ValueError: the image is not ``shape``, or its bytes are not a JPEG the decoder reads.
        """
        data = self.blob[self.offsets[index] : self.offsets[index + 1]]
        try:
            if self.decoder == "simplejpeg":
                import simplejpeg

                got = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out).shape
            elif self.decoder == "opencv":
                import cv2

                bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
                if bgr is None:
                    raise ValueError("OpenCV could not decode it")
                got = bgr.shape
                if got == out.shape:
                    cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=out)
            else:
                from PIL import Image

                with Image.open(io.BytesIO(data)) as im:
                    rgb = np.asarray(im.convert("RGB"))
                got = rgb.shape
                if got == out.shape:
                    out[...] = rgb
        except (ValueError, OSError) as err:  # PIL raises OSError (UnidentifiedImageError) on bad bytes
            raise ValueError(f"sample {index}: {err} (expected a {self.shape} JPEG)") from err
        if tuple(got[:2]) != self.shape:
            raise ValueError(f"sample {index} decodes to {tuple(got[:2])}, not shape={self.shape}: resize it offline")

    def decode_batch(self, indices: Sequence[int], out: torch.Tensor) -> torch.Tensor:
        """Decode ``indices`` into the first ``len(indices)`` rows of ``out`` (a ``(>=B, H, W, 3)`` uint8 tensor)."""
        rows = out.numpy()
        for row, index in enumerate(indices):
            self.decode_into(int(index), rows[row])
        return out[: len(indices)]

    def _fresh(self, count: int, fault: bool) -> torch.Tensor:
        shape = (count, *self.shape, 3)
        in_worker = torch.utils.data.get_worker_info() is not None
        out = _shared_uint8(shape) if in_worker else torch.empty(shape, dtype=torch.uint8)
        return prefault_pages(out) if fault else out

    def __getitem__(self, key):
        if isinstance(key, int | np.integer):
            if not -len(self) <= key < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} samples")
            index = int(key) % len(self)
            image = torch.empty((*self.shape, 3), dtype=torch.uint8)
            self.decode_into(index, image.numpy())
            return image, int(self.labels[index])
        if isinstance(key, BatchRequest):
            raise TypeError("a BatchRequest needs a ring: iterate a JpegLoader(dataset, ..., reuse=True)")
        indices = list(key)
        return self.decode_batch(indices, self._fresh(len(indices), fault=True)), self.labels[indices]


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
        reuse: decode into a ring of shared batches allocated once (``ring_slots`` of them). A slot is
            reused only once no tensor in this process still refers to it; otherwise a fresh batch is
            decoded, so keeping batches (``kept.append(images)``) is safe, just slower. Not tracked:
            raw pointers (``data_ptr()``, ctypes) and pinning a batch in place (``cudaHostRegister``)
            for an asynchronous copy; ``images.to("cuda")`` from this pageable memory has read the
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
        reuse: bool = True,
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


@dataclass(frozen=True)
class PipelineEfficiency:
    """Each variant's samples/s as a share of the ideal: ``reference``'s one-core rate times ``cores``.

    Attributes:
        reference: the one-core decode variant the ideal is built from.
        single_core_rate: its samples/s.
        cores: the cores the ideal assumes.
        rates: ``(variant, samples/s, efficiency)`` per variant, from the medians of the same interleaved
            rounds; efficiency = samples/s / (``single_core_rate`` x ``cores``).
    """

    reference: str
    single_core_rate: float
    cores: int
    rates: tuple[tuple[str, float, float], ...]

    def __getitem__(self, variant: str) -> float:
        """The efficiency of ``variant`` (1.0: every core decodes as fast as one core alone)."""
        for name, _, efficiency in self.rates:
            if name == variant:
                return efficiency
        raise KeyError(f"{variant!r} is not one of {[r[0] for r in self.rates]}")

    def _table(self) -> tuple[list[str], list[list[str]]]:
        ideal = self.single_core_rate * self.cores
        header = ["variant", "samples/s", f"share of {self.cores} x {self.single_core_rate:,.0f}/s = {ideal:,.0f}/s"]
        return header, [[name, f"{rate:,.0f}", f"{eff:.0%}"] for name, rate, eff in self.rates]

    def _repr_markdown_(self) -> str:
        return markdown_table(*self._table())

    def _repr_html_(self) -> str:
        return html_table(*self._table())

    def __repr__(self) -> str:
        return markdown_table(*self._table())


def pipeline_efficiency(comparison: Comparison, reference: str, *, cores: int | None = None) -> PipelineEfficiency:
    """Read every variant of ``comparison`` against the ideal of ``cores`` cores decoding like ``reference``.

    Args:
        comparison: a ``compare(...)`` result with ``items`` (samples per call) for its variants.
        reference: the variant that decodes on one core.
        cores: the cores the ideal assumes (default: the cores this process may run on).
    Raises:
        TypeError: ``comparison`` is not a Comparison.
        ValueError: the comparison has no samples/s (no ``items``).
        KeyError: ``reference`` is not a variant.
    """
    if not isinstance(comparison, Comparison):
        raise TypeError(f"comparison must be a Comparison (from compare), got {type(comparison).__name__}")
    cores = len(os.sched_getaffinity(0)) if cores is None and hasattr(os, "sched_getaffinity") else cores
    cores = cores or os.cpu_count() or 1
    check_positive(cores, "cores", allow_none=False, integer=True)
    single = comparison[reference].measurement.items_per_second
    if not single:
        raise ValueError("the comparison has no samples/s: pass items= (samples per call) to compare")
    rates = []
    for name in comparison.names:
        rate = comparison[name].measurement.items_per_second or 0.0
        rates.append((name, rate, rate / (single * cores)))
    return PipelineEfficiency(reference=reference, single_core_rate=single, cores=cores, rates=tuple(rates))
