"""What a lossy trick costs in accuracy, as one table: accuracy, output error and size against fp32.

- ``AccuracyTable(reference_accuracy)``: rows added with ``add(variant, accuracy, error=..., size_bytes=...)``;
  renders as a Markdown table (columns that no row fills are left out).
- ``AccuracyCost``: one row; ``text`` is the short cell a verdict table shows ("99.5% (fp32 99.7%)").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tricks_lib.formatting import format_bytes, html_table, markdown_table
from tricks_lib.inference.conversions import OutputError

__all__ = ["AccuracyCost", "AccuracyTable"]


def _check_fraction(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a fraction of correct predictions (a float), got {value!r}")
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"{name} must lie in [0, 1] (e.g. 0.97 for 97%), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class AccuracyCost:
    """One lossy variant: its test accuracy against the reference's, and optionally error and size."""

    variant: str
    accuracy: float
    reference_accuracy: float
    error: OutputError | None = None  # its outputs against the reference's, on the same inputs
    size_bytes: int | None = None  # size on disk
    note: str = ""

    @property
    def change(self) -> float:
        """Accuracy minus the reference's (a fraction: -0.012 is 1.2 points lost)."""
        return self.accuracy - self.reference_accuracy

    @property
    def text(self) -> str:
        """The short cell for a verdict table: '98.4% (fp32 98.7%)'."""
        return f"{self.accuracy:.1%} (fp32 {self.reference_accuracy:.1%})"

    def __repr__(self) -> str:
        return f"AccuracyCost({self.variant!r}: {self.text}, change {self.change * 100:+.1f} points)"


class AccuracyTable:
    """Lossy variants of one model, each against the same fp32 reference.

    Args:
        reference_accuracy: the fp32 model's test accuracy (a fraction in [0, 1]).
        label: a caption (what model, which split).
        reference_size_bytes: the fp32 model's size on disk, shown in the reference row when given.

    Raises:
        TypeError / ValueError: an accuracy that is not a fraction in [0, 1], a size that is not a
            non-negative int, a non-string label.
    """

    def __init__(self, reference_accuracy: float, *, label: str = "", reference_size_bytes: int | None = None):
        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__}")
        self.label = label
        self.reference = AccuracyCost(
            "fp32", _check_fraction(reference_accuracy, "reference_accuracy"), float(reference_accuracy),
            size_bytes=_check_size(reference_size_bytes),
        )  # fmt: skip
        self.rows: list[AccuracyCost] = []

    def add(
        self,
        variant: str,
        accuracy: float,
        *,
        error: OutputError | None = None,
        size_bytes: int | None = None,
        note: str = "",
    ) -> AccuracyCost:
        """Add (and return) one variant's row. A variant name already in the table is a ValueError."""
        if not isinstance(variant, str) or not variant:
            raise TypeError(f"variant must be a non-empty name, got {variant!r}")
        if any(row.variant == variant for row in self.rows):
            raise ValueError(f"variant {variant!r} is already in the table: give each row its own name")
        if error is not None and not isinstance(error, OutputError):
            raise TypeError(f"error must be an OutputError (from output_error), got {type(error).__name__}")
        if not isinstance(note, str):
            raise TypeError(f"note must be a string, got {type(note).__name__}")
        row = AccuracyCost(
            variant,
            _check_fraction(accuracy, "accuracy"),
            self.reference.accuracy,
            error,
            _check_size(size_bytes),
            note,
        )
        self.rows.append(row)
        return row

    def __getitem__(self, variant: str) -> AccuracyCost:
        for row in self.rows:
            if row.variant == variant:
                return row
        raise KeyError(f"no variant {variant!r}; variants are {[r.variant for r in self.rows]}")

    def __len__(self) -> int:
        return len(self.rows)

    def _table(self) -> tuple[list[str], list[list[str]]]:
        rows = [self.reference, *self.rows]
        columns = [
            ("variant", lambda r: r.variant, True),
            ("test accuracy", lambda r: f"{r.accuracy:.1%}", True),
            ("change (points)", lambda r: "-" if r is self.reference else f"{r.change * 100:+.1f}", True),
            ("top-1 agreement with fp32", lambda r: f"{r.error.top1_agreement:.1%}" if r.error and r.error.top1_agreement is not None else "-",
             any(r.error for r in rows)),
            ("max logit error (largest fp32 logit)",
             lambda r: f"{r.error.max_abs_error:.3g} ({r.error.reference_scale:.3g})" if r.error else "-",
             any(r.error for r in rows)),
            ("size on disk", lambda r: format_bytes(r.size_bytes) if r.size_bytes is not None else "-",
             any(r.size_bytes is not None for r in rows)),
            ("note", lambda r: r.note or "-", any(r.note for r in rows)),
        ]  # fmt: skip
        shown = [(title, cell) for title, cell, keep in columns if keep]
        return [title for title, _ in shown], [[cell(r) for _, cell in shown] for r in rows]

    def to_markdown(self) -> str:
        header, body = self._table()
        return markdown_table(header, body, caption=self.label or None)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        header, body = self._table()
        return html_table(header, body, caption=self.label or None)

    def __repr__(self) -> str:
        return self.to_markdown()


def _check_size(size: object) -> int | None:
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size_bytes must be an int (bytes) or None, got {size!r}")
    if size < 0:
        raise ValueError(f"size_bytes must not be negative, got {size}")
    return size
