"""Samples as every writer and reader here sees them: ``{"__key__": str, ext: bytes, ...}``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

__all__ = ["check_samples"]


def check_samples(samples: Iterable[dict]) -> Iterator[dict]:
    """Yield samples after checking each is ``{"__key__": str, ext: bytes, ...}``: every writer's first step.

    Lazy (a generator), so a writer streams its input and still refuses a bad sample before it
    writes anything under a final name.

    A key is a relative name whose '/'-separated parts are non-empty, whose last part has no '.',
    and which holds no control character (every writer must be able to store it and read it back).
    Raises TypeError/ValueError saying what to change.
    """
    for sample in samples:
        if not isinstance(sample, dict) or not isinstance(sample.get("__key__"), str):
            raise TypeError('each sample must be a dict with a str "__key__" and bytes fields')
        key = sample["__key__"]
        if not key or "." in os.path.basename(key) or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"sample key {key!r} must be a non-empty relative name without '.'")
        if any(ord(c) < 32 or ord(c) == 127 for c in key):
            raise ValueError(
                f"sample key {key!r} contains a control character (newline, tab, ...): "
                "LMDB's key list and file names cannot hold it; remove it from the key"
            )
        if any(part in ("", ".") for part in key.split("/")):
            raise ValueError(
                f"sample key {key!r} has an empty or '.' path part (a trailing or double "
                "'/'): folder and tar readers cannot find it; use e.g. 'dir/name'"
            )
        for ext, value in sample.items():
            if ext.startswith("__"):
                continue
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(
                    f"sample {key!r} field {ext!r} must be bytes, got {type(value).__name__}"
                    " (encode it first, e.g. str(label).encode())"
                )
        yield sample
