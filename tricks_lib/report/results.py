"""Recording measured results so the main command can collect them into one summary.

A notebook calls ``record("channels_last", comparison)`` once per measured trick. The value is
returned (a ``Record``) and, when the main command runs the notebook, also appended as one JSON line
to the file named by the environment variable ``TRICKS_RESULTS``. Outside the main command nothing
is written anywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tricks_lib.env import describe
from tricks_lib.outcome import Summarizable

__all__ = ["Record", "load_records", "record"]

RESULTS_ENV_VAR = "TRICKS_RESULTS"
NOTEBOOK_ENV_VAR = "TRICKS_NOTEBOOK"


@dataclass(frozen=True)
class Record:
    """One measured trick: its rows (variant, median, spread, speedup, memory), where and on what."""

    notebook: str
    trick: str
    kind: str  # the result's type: "comparison", "measurement", "memory", "compile", "batch search"
    rows: tuple[dict, ...]  # the result's details (``to_dict()``; a comparison: one per variant)
    device: str
    machine: str  # describe().summary() of the machine that measured it
    summary: tuple[dict, ...] = ()  # the result's own ``SummaryRow``s, as dicts: what summary.json lists

    def to_dict(self) -> dict:
        return {
            "notebook": self.notebook,
            "trick": self.trick,
            "kind": self.kind,
            "rows": list(self.rows),
            "device": self.device,
            "machine": self.machine,
            "summary": list(self.summary),
        }

    def __repr__(self) -> str:
        return f"Record({self.trick!r}, {self.kind}, {len(self.rows)} rows, {self.device})"


def _rows_of(result: Summarizable) -> tuple[str, tuple[dict, ...], str, tuple[dict, ...]]:
    kind = getattr(type(result), "record_kind", None)  # each result type names its own kind
    if not isinstance(kind, str) or not callable(getattr(result, "summary_rows", None)):
        raise TypeError(
            f"record() takes a Comparison, Measurement, MemoryReport, CompileCost, BatchSearch or VerdictRow, got "
            f"{type(result).__name__}; time with tricks_lib or measure with tricks_lib.memory first"
        )
    summary = tuple(row.to_dict() for row in result.summary_rows())
    details = result.to_dict()
    rows = tuple(details["rows"]) if kind == "comparison" else (details,)
    device = summary[0]["device"] if summary else "unknown"
    return kind, rows, device, summary


def record(
    trick: str,
    result: Summarizable,
    *,
    notebook: str | None = None,
) -> Record:
    """Stamp ``result`` with the trick's name, notebook and machine; write it out under the main command.

    Args:
        trick: a short name for the trick, e.g. ``"channels_last"``.
        result: what was measured.
        notebook: the notebook's name (default: set by the main command, else ``"interactive"``).

    Raises:
        TypeError: ``result`` is not a measured result, or ``trick`` is not a string.
        ValueError: ``trick`` is empty.
    """
    if not isinstance(trick, str):
        raise TypeError(f"trick must be a string naming the trick, got {type(trick).__name__}")
    if not trick.strip():
        raise ValueError("trick must name the trick, e.g. 'channels_last'")
    kind, rows, device, summary = _rows_of(result)
    rec = Record(
        notebook=notebook or os.environ.get(NOTEBOOK_ENV_VAR) or "interactive",
        trick=trick,
        kind=kind,
        rows=rows,
        device=device,
        machine=describe().summary(),
        summary=summary,
    )
    target = os.environ.get(RESULTS_ENV_VAR)
    if target:
        # One line per record, appended and flushed at once, so a crash later in the notebook keeps it.
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec.to_dict(), allow_nan=False) + "\n")
    return rec


def load_records(path: str | Path, problems: list[str] | None = None) -> list[Record]:
    """Read the records a run appended to ``path`` (missing file: no records).

    ``problems``: a list to collect bad lines in (each skipped, with a message naming it) instead of raising,
    so that the main command still writes the summary of everything else and names what it skipped.

    Raises:
        ValueError: a line is not a record (the file is corrupt, e.g. a write torn by a kill); the message
            names the line. Not raised when ``problems`` is given.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            records.append(
                Record(
                    notebook=d["notebook"],
                    trick=d["trick"],
                    kind=d["kind"],
                    rows=tuple(d["rows"]),
                    device=d["device"],
                    machine=d["machine"],
                    summary=tuple(d.get("summary", ())),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            message = f"{path.name} line {lineno} is not a result record ({type(err).__name__}: {err})"
            if problems is None:
                raise ValueError(message) from err
            problems.append(message + "; skipped")
    return records
