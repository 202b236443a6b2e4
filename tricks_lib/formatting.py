"""Formatting for people: seconds and bytes with readable units, and Markdown/HTML tables.

A leaf module: it imports nothing from tricks_lib, so every other module (and a reader's code) can
use it without pulling in torch or the harness.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

__all__ = ["format_bytes", "format_seconds", "html_table", "markdown_cell", "markdown_table", "speedup_text"]


def format_seconds(seconds: float) -> str:
    """A time with a readable unit: ``format_seconds(0.00123) == '1.23 ms'``."""
    if not math.isfinite(seconds):
        return str(seconds)
    # Three significant digits stop at 999 s; past that "1.29e+03 s" would be printed.
    if abs(seconds) >= 36000:
        return f"{seconds / 3600:.1f} h"
    if abs(seconds) >= 1000:
        return f"{seconds / 60:.1f} min"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_bytes(n: int | float | None) -> str:
    """Bytes with a binary unit: ``format_bytes(1536) == '1.50 KiB'``; ``'-'`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def markdown_cell(text: object) -> str:
    """``text`` as one Markdown table cell: pipes escaped, line breaks turned into spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None = None) -> str:
    """A Markdown table (pipes in cells escaped), with an optional caption line above it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows]
    table = "\n".join(lines)
    return f"{caption}\n\n{table}" if caption else table


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None = None) -> str:
    """An HTML table with every cell escaped, and an optional caption."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{th}</tr>{trs}</table>"


def speedup_text(r: dict) -> str:
    """'1.22x [1.17, 1.25]': a row's speedup with its paired interval when it has one; '-' without a speedup."""
    if r.get("speedup") is None:
        return "-"
    low, high = r.get("speedup_low"), r.get("speedup_high")
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{r['speedup']:.2f}x{interval}"
