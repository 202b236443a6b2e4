"""Fingerprints: a short hash of the exact bytes of a model, state dict or tensors."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import numpy as np
import torch

# Hex digits kept from the SHA-256: 64 bits, short enough to read, collisions negligible here.
_FINGERPRINT_DIGITS = 16


_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_UNORDERED = (
    "a set (or a dict's keys()/items() view) has no stable order, so its fingerprint would change from "
    "run to run; pass a list sorted by a stable key, or the dict itself"
)


def _tensor_bytes(t: torch.Tensor, where: str) -> bytes:
    if t.layout != torch.strided:
        raise TypeError(f"{where}: {t.layout} tensors are not supported; fingerprint t.to_dense() instead")
    if t.is_quantized:
        raise TypeError(f"{where}: quantized tensors are not supported; fingerprint t.int_repr() instead")
    if t.device.type == "meta":
        raise TypeError(f"{where}: meta tensors hold no data to fingerprint")
    flat = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    # Reinterpret as raw bytes: works for every dtype, bf16 and fp8 included (NumPy has no bf16).
    return flat.view(torch.uint8).numpy().tobytes()


def _feed(h, obj: object, where: str) -> None:
    if isinstance(obj, torch.Tensor):
        h.update(f"tensor|{obj.dtype}|{tuple(obj.shape)}|".encode())
        h.update(_tensor_bytes(obj, where))
    elif isinstance(obj, np.ndarray):
        h.update(f"ndarray|{obj.dtype.str}|{obj.shape}|".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, torch.nn.Module):
        _feed(h, obj.state_dict(), where)  # parameters and buffers, by name
    elif isinstance(obj, Mapping):
        # Sorted by key so that two dicts with the same items match whatever their insertion order.
        items = sorted(obj.items(), key=lambda kv: repr(kv[0]))
        h.update(f"mapping|{len(items)}|".encode())
        for key, value in items:
            if not isinstance(key, _SCALARS):
                raise TypeError(f"{where}: mapping keys must be str/int/float/bool/None, got {type(key).__name__}")
            h.update(f"key|{type(key).__name__}|{key!r}|".encode())
            _feed(h, value, f"{where}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        h.update(f"sequence|{len(obj)}|".encode())
        for i, value in enumerate(obj):
            _feed(h, value, f"{where}[{i}]")
    elif isinstance(obj, (torch.dtype, torch.device, torch.Size)):
        h.update(f"{type(obj).__name__}|{obj}|".encode())
    elif isinstance(obj, np.generic) and not isinstance(obj, np.datetime64 | np.timedelta64):
        _feed(h, obj.item(), where)  # a NumPy scalar hashes like the Python number it holds
    elif isinstance(obj, _SCALARS):
        h.update(f"{type(obj).__name__}|{obj!r}|".encode())  # repr of a float is exact
    elif isinstance(obj, AbstractSet):
        raise TypeError(f"{where}: {_UNORDERED}")
    else:
        raise TypeError(
            f"{where}: cannot fingerprint a {type(obj).__name__}; pass tensors, arrays, modules, state "
            "dicts, or lists/tuples/dicts of them (numbers and strings are allowed inside)"
        )


def fingerprint(obj: object) -> str:
    """A short stable hash of the exact bytes of ``obj``: equal fingerprints mean bitwise-equal values.

    Accepted: a tensor; an ``nn.Module`` (its ``state_dict()``: parameters and buffers, by name);
    a mapping such as a model's or optimizer's state dict (keys sorted, values hashed recursively:
    tensors, NumPy arrays, nested dicts/lists, numbers (NumPy scalars hash as the Python number
    ``.item()`` gives), strings, None); or an iterable of tensors
    such as ``model.parameters()``. Each tensor contributes its dtype, shape and raw bytes (bf16,
    fp8 and complex included), not its device or ``requires_grad``; so a one-ulp change, a -0.0
    for a 0.0, a different dtype or shape, or a renamed key all change the fingerprint.

    Returns:
        16 hexadecimal digits (the first 64 bits of a SHA-256).

    Raises:
        TypeError: ``obj`` (or something inside it) is of an unsupported type, e.g. a string, a
            number or an arbitrary object at the top level, or a sparse, quantized or meta tensor;
            or it is unordered (a set, a frozenset, a dict's ``keys()`` or ``items()`` view), whose
            iteration order can differ between runs.
    """
    h = hashlib.sha256()
    if isinstance(obj, AbstractSet):  # set, frozenset, dict.keys(), dict.items(): no stable order
        raise TypeError(f"fingerprint: {_UNORDERED}")
    if isinstance(obj, (torch.Tensor, np.ndarray, torch.nn.Module, Mapping, list, tuple)):
        _feed(h, obj, "fingerprint")
    elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        items = list(obj)  # e.g. a generator such as model.parameters()
        if not all(isinstance(t, torch.Tensor) for t in items):
            raise TypeError("fingerprint: an iterable must yield tensors only, e.g. model.parameters()")
        _feed(h, items, "fingerprint")
    else:
        raise TypeError(
            f"fingerprint: cannot fingerprint a {type(obj).__name__}; pass a tensor, a module, a state "
            "dict or an iterable of tensors"
        )
    return h.hexdigest()[:_FINGERPRINT_DIGITS]
