"""Memory, measured exactly on any device.

Activation memory (what autograd keeps for the backward pass) is what most memory tricks cut.
``measure_memory`` counts it with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd
saves during one call passes through the hook, so the count is exact and deterministic on a CPU too,
without being handed the model. On CUDA the allocator's peaks are reported next to it.
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from tricks_lib.env import pick_device
from tricks_lib.formatting import format_bytes
from tricks_lib.outcome import SummaryRow

__all__ = ["MemoryReport", "StateBytes", "measure_memory", "model_state_bytes"]


@dataclass(frozen=True)
class MemoryReport:
    """Memory used by one call of a function.

    ``saved_bytes`` counts the tensors autograd saved for backward during the call, once per storage,
    leaving out parameters, views of them and casts of them (a Linear saves its weight transposed,
    and under autocast a low-precision copy of it: neither grows with the batch, neither is
    activation memory; a frozen parameter's cast has no autograd history and is counted). ``peak_saved_bytes`` is the most of those alive at one time: the same for a
    single forward pass, smaller when the call frees saved tensors and saves new ones (several
    forward/backward passes, as in gradient accumulation). A saved view counts its whole storage.
    The CUDA fields are None on other devices.
    """

    record_kind: ClassVar[str] = "memory"  # the kind ``record()`` files it under

    label: str
    device: str
    saved_bytes: int
    saved_tensors: int  # distinct storages counted
    peak_saved_bytes: int = 0  # most saved bytes alive at once during the call
    peak_allocated_bytes: int | None = None  # CUDA: max bytes allocated during the call
    peak_reserved_bytes: int | None = None  # CUDA: max bytes the caching allocator held
    allocated_before_bytes: int | None = None  # CUDA: bytes already allocated when the call began

    @property
    def peak_extra_bytes(self) -> int | None:
        """CUDA: how far the call pushed allocation above where it started."""
        if self.peak_allocated_bytes is None or self.allocated_before_bytes is None:
            return None
        return self.peak_allocated_bytes - self.allocated_before_bytes

    @property
    def saved_text(self) -> str:
        """Saved-for-backward bytes as a table shows them; a call that built no autograd graph says so."""
        if self.saved_tensors == 0:
            return "0 B (no autograd graph: nothing saved for backward)"
        text = format_bytes(self.saved_bytes)
        if self.peak_saved_bytes != self.saved_bytes:
            text += f" (at most {format_bytes(self.peak_saved_bytes)} at once)"
        return text

    def __repr__(self) -> str:
        if self.saved_tensors == 0:
            parts = ["nothing saved for backward (no autograd graph)"]
        else:
            parts = [f"saved for backward {format_bytes(self.saved_bytes)} in {self.saved_tensors} tensors"]
        if self.peak_saved_bytes != self.saved_bytes:
            parts.append(f"at most {format_bytes(self.peak_saved_bytes)} alive at once")
        if self.peak_allocated_bytes is not None:
            parts.append(
                f"peak allocated {format_bytes(self.peak_allocated_bytes)} "
                f"({format_bytes(self.peak_extra_bytes)} above the call's start)"
            )
            parts.append(f"peak reserved {format_bytes(self.peak_reserved_bytes)}")
        return f"MemoryReport({self.label!r} on {self.device}: " + ", ".join(parts) + ")"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def change_from(self, before: MemoryReport, field: str = "peak_saved_bytes") -> str:
        """'3.10x less', 'same', '1.20x more' or 'none kept (was X)': this report's ``field`` against ``before``'s.

        ``field`` defaults to the most saved-for-backward bytes alive at once: for one forward and backward
        that is everything the forward saved; for several passes (accumulation) one pass's worth.

        Raises:
            TypeError: ``before`` is not a MemoryReport.
            ValueError: ``field`` is not a byte count of a MemoryReport, or a report lacks it (CUDA-only fields).
        """
        if not isinstance(before, MemoryReport):
            raise TypeError(f"before must be a MemoryReport (measure_memory(...)), got {type(before).__name__}")
        if field not in ("saved_bytes", "peak_saved_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
            raise ValueError(f"field must name a MemoryReport byte count such as 'peak_saved_bytes', got {field!r}")
        base, new = getattr(before, field), getattr(self, field)
        if base is None or new is None:
            raise ValueError(f"{field} was not measured on {before.device} (CUDA only): pick 'peak_saved_bytes'")
        if new == base:
            return "same"
        if new == 0:
            return f"none kept (was {format_bytes(base)})"
        return f"{base / new:.2f}x less" if new < base else f"{new / base:.2f}x more"

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        return (
            SummaryRow(
                variant=self.label,
                device=self.device,
                saved_bytes=self.saved_bytes,
                peak_saved_bytes=self.peak_saved_bytes,
                peak_allocated_bytes=self.peak_allocated_bytes,
            ),
        )

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "device": self.device,
            "saved_bytes": self.saved_bytes,
            "saved_tensors": self.saved_tensors,
            "peak_saved_bytes": self.peak_saved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "allocated_before_bytes": self.allocated_before_bytes,
        }


# Autograd nodes that only re-express a tensor (a cast, a transpose, a reshape): a chain of them that
# ends at a parameter means the saved tensor is that parameter in another form, not an activation.
_REEXPRESSING_NODES = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "TransposeBackward0",
        "ViewBackward0",
        "ReshapeAliasBackward0",
        "PermuteBackward0",
        "ExpandBackward0",
        "UnsqueezeBackward0",
        "SqueezeBackward0",
        "AliasBackward0",
    }
)


def _is_parameter_or_copy(t: torch.Tensor) -> bool:
    """A parameter, a view of one, or a re-expression of one (autocast's low-precision weight copies)."""
    base = t._base if t._base is not None else t
    if isinstance(t, torch.nn.Parameter) or isinstance(base, torch.nn.Parameter):
        return True
    node = base.grad_fn
    while node is not None and type(node).__name__ in _REEXPRESSING_NODES:
        parents = [fn for fn, _ in node.next_functions if fn is not None]
        if len(parents) != 1:
            return False
        node = parents[0]
        if type(node).__name__ == "AccumulateGrad":
            return isinstance(node.variable, torch.nn.Parameter)
    return False


def _storage_key_and_bytes(t: torch.Tensor) -> tuple[tuple, int]:
    """A key identifying the tensor's memory, and that memory's size in bytes."""
    if t.layout == torch.sparse_coo:
        # No single storage: the memory is the index and value tensors (numel() is the dense size).
        return ("tensor", id(t)), t._indices().nbytes + t._values().nbytes
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return ("tensor", id(t)), t.crow_indices().nbytes + t.col_indices().nbytes + t.values().nbytes
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return ("tensor", id(t)), t.ccol_indices().nbytes + t.row_indices().nbytes + t.values().nbytes
    if t.layout != torch.strided or t.is_nested:
        # Nested tensors have no single storage either; numel() counts their components' elements.
        return ("tensor", id(t)), t.element_size() * t.numel()
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr()), storage.nbytes()


class _LiveSaved:
    """Bytes of the saved storages that some autograd graph still holds, and their running maximum."""

    def __init__(self) -> None:
        self.holders: dict[tuple, list[int]] = {}  # storage key -> [bytes, graphs' references to it]
        self.bytes = 0
        self.peak = 0
        self.closed = False

    def hold(self, key: tuple, nbytes: int) -> None:
        if self.closed:
            return
        entry = self.holders.get(key)
        if entry is None:
            self.holders[key] = [nbytes, 1]
            self.bytes += nbytes
            self.peak = max(self.peak, self.bytes)
        else:
            entry[1] += 1

    def release(self, key: tuple) -> None:
        if self.closed:
            return
        entry = self.holders.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.holders[key]
            self.bytes -= entry[0]

    def close(self) -> None:
        self.closed = True
        self.holders.clear()


class _Packed:
    """What autograd stores for one saved tensor while ``measure_memory`` counts.

    Autograd drops it when it frees the graph's saved variables (after backward, or when the graph
    dies with its outputs); that moment, not the storage's death, ends the tensor's life as saved
    memory. While a ``_Packed`` holds the tensor, its storage is alive, so its key cannot be reused.
    """

    __slots__ = ("key", "live", "tensor", "version")

    def __init__(self, tensor: torch.Tensor, version: int, key: tuple | None, live: _LiveSaved) -> None:
        self.tensor, self.version, self.key, self.live = tensor, version, key, live

    def __del__(self) -> None:
        if self.key is not None:
            self.live.release(self.key)


def measure_memory(
    fn: Callable[[], object],
    *,
    label: str | None = None,
    device: str | torch.device | None = None,
) -> MemoryReport:
    """Run ``fn()`` once and report the memory it used.

    Args:
        fn: a zero-argument callable (e.g. ``lambda: model(x)`` or a whole training step).
        label: a name for the report (default: the callable's name).
        device: whose allocator peaks to read (default ``pick_device()``); only CUDA has them.

    Returns:
        A ``MemoryReport``. ``saved_bytes`` is exact on every device. Tensors saved inside a
        ``torch.utils.checkpoint`` region are not saved (that is the point) and are not counted;
        the region's inputs are. Saved-tensor hooks registered inside ``fn`` (checkpointing,
        ``torch.autograd.graph.save_on_cpu``) take precedence over this one: what they handle
        is not seen here.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a zero-argument callable, got {type(fn).__name__}")
    dev = pick_device(device) if device is not None else pick_device()
    name = label if label is not None else getattr(fn, "__name__", "fn")
    counted: list[int] = []  # bytes of each distinct storage seen
    # Address -> weak reference to the storage counted there. A dead reference means that storage was
    # freed during the call and a new one reuses its address: that one is new and counted again.
    # Weak, so the measurement never keeps memory alive that the call itself would free.
    seen: dict[tuple, weakref.ref | None] = {}
    # Saved bytes that autograd holds right now, and their maximum. A saved tensor counts from the
    # moment autograd saves it until the graph that holds it is freed (backward ran, or the output
    # died), not until its storage dies: inputs the caller keeps alive (a list of batches) are no
    # longer held for backward once their step is done. A storage saved by several nodes counts once.
    live = _LiveSaved()

    def pack(t: torch.Tensor) -> _Packed:
        key = None
        if not _is_parameter_or_copy(t):
            key, nbytes = _storage_key_and_bytes(t)
            ref = seen.get(key, False)
            if ref is False or (ref is not None and ref() is None):
                counted.append(nbytes)
                seen[key] = None if key[0] == "tensor" else weakref.ref(t.untyped_storage())
            live.hold(key, nbytes)
        # Detached: returning the tensor itself would make a reference cycle through autograd's C++
        # graph that the garbage collector cannot break (the graph would never be freed).
        # The version is kept because autograd skips its own in-place check for hooked tensors.
        return _Packed(t.detach(), t._version, key, live)

    def unpack(packed: _Packed) -> torch.Tensor:
        t, version = packed.tensor, packed.version
        if t._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: a {tuple(t.shape)} {t.dtype} tensor is at version {t._version}; expected version "
                f"{version} instead (checked by tricks_lib.memory.measure_memory, which replaces autograd's own "
                "check while it counts)"
            )
        return t

    cuda = dev.type == "cuda"
    before = None
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            fn()
    finally:
        live.close()  # the call is over: graphs freed later are none of this report's business
    peak_alloc = peak_reserved = None
    if cuda:
        torch.cuda.synchronize(dev)
        peak_alloc = torch.cuda.max_memory_allocated(dev)
        peak_reserved = torch.cuda.max_memory_reserved(dev)
    return MemoryReport(
        label=name,
        device=str(dev),
        saved_bytes=sum(counted),
        saved_tensors=len(counted),
        peak_saved_bytes=live.peak,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_reserved,
        allocated_before_bytes=before,
    )


@dataclass(frozen=True)
class StateBytes:
    """Bytes of a model's persistent training state."""

    parameters: int
    gradients: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    def __repr__(self) -> str:
        return (
            f"StateBytes(parameters {format_bytes(self.parameters)}, gradients {format_bytes(self.gradients)}, "
            f"optimizer state {format_bytes(self.optimizer_state)}, total {format_bytes(self.total)})"
        )

    def to_dict(self) -> dict:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "total": self.total,
        }


def _unique_bytes(tensors) -> int:
    seen: dict[tuple, int] = {}
    for t in tensors:
        key, nbytes = _storage_key_and_bytes(t)
        seen.setdefault(key, nbytes)
    return sum(seen.values())


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Bytes of parameters, of their current gradients, and of the optimizer's state (e.g. Adam's moments).

    Shared storages are counted once. Gradients that are None (never computed, or zeroed with
    ``set_to_none=True``) cost nothing and count nothing.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``optimizer`` not a ``torch.optim.Optimizer``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state = []
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    return StateBytes(
        parameters=_unique_bytes(params),
        gradients=_unique_bytes(grads),
        optimizer_state=_unique_bytes(state),
    )
