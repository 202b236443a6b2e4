"""How long each notebook took, as the main command last recorded it, and the line that says so.

Every run of ``python -m tricks_lib run`` records each notebook's run time per mode in
``run_times.json`` beside the notebooks (with the machine it ran on); ``--refresh`` writes the
recorded times into the notebook's title cell, so a reader knows what running it will cost before
pressing Run All, from a measurement rather than a guess.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib.formatting import format_seconds

__all__ = ["LEDGER_NAME", "MARKER", "record_run_time", "recorded_cell_seconds", "run_time_line", "stamp_run_time"]

LEDGER_NAME = "run_times.json"
MARKER = "<!-- run time: written by the main command -->"
MODES = ("quick", "full")


def _read(folder: Path) -> dict:
    try:
        ledger = json.loads((Path(folder) / LEDGER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return ledger if isinstance(ledger, dict) else {}


def record_run_time(
    folder: str | Path, notebook: str, *, quick: bool, seconds: float, machine: str, cells: list[float] = ()
) -> None:
    """Record that ``notebook`` ran cleanly in ``seconds`` (in quick or full mode) on ``machine``.

    ``cells``: each code cell's seconds, in order (the main command's progress bar reads them next time).

    Raises:
        ValueError: ``seconds`` is negative or not finite.
    """
    if not (isinstance(seconds, (int, float)) and 0 <= seconds < float("inf")):
        raise ValueError(f"seconds must be a finite, non-negative run time, got {seconds!r}")
    ledger = _read(Path(folder))
    entry = ledger.setdefault(notebook, {})
    entry["quick" if quick else "full"] = {
        "seconds": round(float(seconds), 1),
        "machine": machine,
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "cells": [round(float(s), 3) for s in cells],
    }
    text = json.dumps(dict(sorted(ledger.items())), indent=1, sort_keys=True) + "\n"
    write_bytes_atomic(Path(folder) / LEDGER_NAME, text.encode("utf-8"))


def recorded_cell_seconds(folder: str | Path, notebook: str, *, quick: bool, cells: int) -> list[float] | None:
    """The last recorded seconds of each code cell, or None when none is recorded for exactly ``cells`` cells."""
    entry = _read(Path(folder)).get(notebook, {}).get("quick" if quick else "full", {})
    seconds = entry.get("cells") if isinstance(entry, dict) else None
    if not isinstance(seconds, list) or len(seconds) != cells or not all(isinstance(s, (int, float)) for s in seconds):
        return None  # the notebook changed since, or nothing recorded: count cells instead
    return [max(float(s), 0.0) for s in seconds]


def run_time_line(folder: str | Path, notebook: str) -> str | None:
    """The title cell's run-time sentence for ``notebook``, or None when nothing was recorded."""
    entry = _read(Path(folder)).get(notebook, {})
    runs = {mode: entry[mode] for mode in MODES if isinstance(entry.get(mode), dict)}
    if not runs:
        return None
    machines = {r["machine"] for r in runs.values()}
    parts = []
    for mode, r in runs.items():
        where = "" if len(machines) == 1 else f" on {r['machine']}"
        parts.append(f"{mode} mode {format_seconds(r['seconds'])}{where} ({r['recorded']})")
    on = f" on {machines.pop()}" if len(machines) == 1 else ""
    return f"{MARKER}\n*Run time, as the main command last recorded it{on}: {'; '.join(parts)}.*"


def stamp_run_time(nb, line: str | None) -> None:
    """Put ``line`` at the end of the notebook's title cell (replacing an earlier one); None removes it."""
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        return
    source = nb.cells[0].source
    if MARKER in source:
        source = source[: source.index(MARKER)].rstrip("\n")
    nb.cells[0].source = source if line is None else f"{source}\n\n{line}"
