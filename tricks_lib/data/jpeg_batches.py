"""The worker side of the JPEG pipeline (:mod:`tricks_lib.data.jpeg_pipeline`): whole batches decoded
per request, each image written by the decoder straight into its row of one preallocated
``(B, H, W, 3)`` uint8 tensor (shared memory inside a DataLoader worker), and what the workers need
besides: one thread each, and a batch's pages faulted in one system call.
"""

from __future__ import annotations

import ctypes
import functools
import io
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from tricks_lib._validate import check_positive

__all__ = ["JPEG_DECODERS", "BatchRequest", "JpegBatchDataset", "limit_worker_threads", "prefault_pages"]

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
