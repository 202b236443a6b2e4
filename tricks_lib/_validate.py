"""Argument checks with one wording and one rule for every module.

TypeError for a wrong type (bools are refused where a number is expected: ``True`` is an int to
Python, never a count to a reader); ValueError for a value out of range, saying what is expected.
"""

from __future__ import annotations

import math


def check_callable(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be a zero-argument callable (e.g. a lambda), got {type(fn).__name__}")


def check_positive(value: object, name: str, *, allow_none: bool = True, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be a {'whole number' if integer else 'number'}, got {value!r}")
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be positive, got {value!r}")


def check_flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_non_negative_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")
