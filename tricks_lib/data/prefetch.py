"""Prefetch the next batch onto the device while the current one is being used.

On CUDA, :class:`DevicePrefetcher` copies batch ``k+1`` host-to-device on a side stream (from
pinned memory, ``non_blocking=True``) while the default stream computes on batch ``k``. On other
devices there is no asynchronous copy to overlap, so it falls back to a background thread that
loads up to ``depth`` batches ahead; that overlaps loading with compute whenever the compute
releases the GIL (PyTorch ops and GPU waits do).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from tricks_lib._validate import check_positive
from tricks_lib.env import pick_device

__all__ = ["DevicePrefetcher", "move_to_device"]


def move_to_device(
    batch: object,
    device: torch.device | str,
    *,
    non_blocking: bool = False,
    pin_memory: bool = False,
    copy: bool = False,
) -> object:
    """Move every tensor in a nested dict/list/tuple to ``device``; other values are kept.

    ``pin_memory=True`` pins CPU tensors first (needed for a truly asynchronous copy). ``copy=True``
    copies tensors already on ``device`` too, so the result never aliases the loader's buffers.
    """
    if isinstance(batch, torch.Tensor):
        if pin_memory and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=non_blocking, copy=copy)
    if isinstance(batch, dict):
        return {
            k: move_to_device(v, device, non_blocking=non_blocking, pin_memory=pin_memory, copy=copy)
            for k, v in batch.items()
        }
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(v, device, non_blocking=non_blocking, pin_memory=pin_memory, copy=copy) for v in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    return batch


def _record_stream(batch: object, stream: torch.cuda.Stream) -> None:
    # Tell the caching allocator the batch is used on the compute stream, so its memory is not
    # reused by the copy stream while kernels on the compute stream still read it.
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _record_stream(v, stream)


_END = object()


class DevicePrefetcher:
    """Iterate over ``loader`` with the next batch already moving to ``device``.

    Args:
        loader: any iterable of batches (tensors, or dicts/lists/tuples of tensors).
        device: target device.
        depth: batches loaded ahead by the CPU fallback thread (>= 1); CUDA copies one ahead.

    Raises:
        TypeError: ``device`` is not a string or a torch.device.
        ValueError: ``depth`` is not a positive whole number, or ``device`` is not a device this machine has
            (as :func:`tricks_lib.env.pick_device` checks: a name, and a CUDA device only where CUDA is).
    """

    def __init__(self, loader: Iterable, device: torch.device | str, *, depth: int = 2):
        check_positive(depth, "depth", allow_none=False, integer=True)
        if device is None:  # pick_device(None) would choose one: the prefetcher needs the caller's
            raise TypeError("device must be a string or a torch.device, got None")
        # pick_device(device) checks it is a device name this machine has (a CUDA one without CUDA: one clear error)
        self.loader, self.device, self.depth = loader, pick_device(device), depth

    @property
    def mode(self) -> str:
        """ "cuda-stream" or "thread" (the CPU fallback)."""
        return "cuda-stream" if self.device.type == "cuda" else "thread"

    def __iter__(self) -> Iterator[object]:
        return self._cuda_iter() if self.mode == "cuda-stream" else self._thread_iter()

    def __len__(self) -> int:
        return len(self.loader)

    def __repr__(self) -> str:
        return f"DevicePrefetcher(device={self.device}, mode={self.mode!r}, depth={self.depth})"

    def _cuda_iter(self) -> Iterator[object]:
        copy_stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        copied = None  # the event after the last copy

        def start_copy():
            nonlocal copied
            # A loader may refill the (pinned) buffer it yielded last as soon as it is asked for the
            # next batch; the asynchronous copy out of that buffer must be finished by then.
            if copied is not None:
                copied.synchronize()
            batch = next(it, _END)
            if batch is _END:
                return _END
            with torch.cuda.stream(copy_stream):
                moved = move_to_device(batch, self.device, non_blocking=True, pin_memory=True)
                copied = torch.cuda.Event()
                copied.record(copy_stream)
            return moved

        upcoming = start_copy()
        while upcoming is not _END:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(copy_stream)  # the batch is ready before compute reads it
            batch = upcoming
            _record_stream(batch, compute)
            upcoming = start_copy()  # overlaps with the caller's compute on this batch
            yield batch

    def _thread_iter(self) -> Iterator[object]:
        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work():
            try:
                for batch in self.loader:
                    # Copied: batches wait in the queue while the loader makes the next ones, and a
                    # loader that refills one buffer would otherwise hand over the same tensor again.
                    if not put(("batch", move_to_device(batch, self.device, copy=True))):
                        return
                put(("end", None))
            except BaseException as e:  # re-raised in the consumer
                put(("error", e))

        thread = threading.Thread(target=work, name="DevicePrefetcher", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = q.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)
