"""What the main command recorded before: each notebook's run time, and the earlier run's summary.

Every run of ``python -m tricks_lib run`` records each notebook's run time per mode in
``run_times.json`` beside the notebooks (with the machine it ran on); ``--refresh`` writes the
recorded times into the notebook's title cell, so a reader knows what running it will cost before
pressing Run All, from a measurement rather than a guess; the next run's progress bar (``CellProgress``)
advances by them.

``earlier_results`` reads the summary an output folder already holds and decides whether a run of
some notebooks (``--only``) may merge into it: the same mode, the same machine, a current row format.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib.env import describe
from tricks_lib.formatting import format_seconds
from tricks_lib.report.summary import written_before_outcomes

if TYPE_CHECKING:
    from tricks_lib.env import EnvInfo

__all__ = [
    "LEDGER_NAME",
    "MARKER",
    "CellProgress",
    "EarlierResults",
    "earlier_results",
    "main_job_cost",
    "record_run_time",
    "recorded_cell_seconds",
    "run_time_line",
    "stamp_run_time",
]

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


class CellProgress:
    """One notebook's progress bar, and the seconds each of its code cells took this time (``seconds``).

    The bar advances by each cell's last recorded time, so that its estimate means something (one cell
    of 01 takes minutes, most take milliseconds); by cells where none is recorded.
    """

    def __init__(self, weights: list[float] | None, cells: int, name: str, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.seconds: list[float] = []
        self._weights = weights
        if weights and sum(weights) >= 1.0:  # under a second in all: counting cells reads as well
            total = sum(weights)  # not rounded: a total below the sum of its updates warns "clamping frac"
            self._bar = tqdm(total=total, desc=name, unit="s", disable=not enabled, leave=True, bar_format=_TIMED_BAR)
        else:
            self._bar = tqdm(total=cells, desc=name, unit="cell", disable=not enabled, leave=True)

    @classmethod
    def for_notebook(
        cls, folders: Sequence[str | Path], notebook: str, *, quick: bool, cells: int, enabled: bool
    ) -> CellProgress:
        """The bar of ``notebook``, weighted by the first of ``folders`` whose ledger has its ``cells`` cells."""
        weights = next(
            (w for f in folders if (w := recorded_cell_seconds(f, notebook, quick=quick, cells=cells)) is not None),
            None,
        )
        return cls(weights, cells, notebook, enabled)

    def cell_done(self, seconds: float) -> None:
        self._bar.update(self._weights[len(self.seconds)] if self._weights else 1)
        self.seconds.append(seconds)

    def close(self) -> None:
        self._bar.close()


# Seconds of the last recorded run done / in all, and the time left estimated from them.
_TIMED_BAR = "{l_bar}{bar}| {n:.0f}/{total:.0f} s of the last run [{elapsed}<{remaining}]"


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


def main_job_cost(folder: str | Path, *, mode: str = "full") -> str:
    """What the main job cost in ``mode`` ("full" or "quick"), as the ledger recorded each notebook's last run in
    it: the sentence the README quotes (a test checks that it does), so the project's figures about itself come
    from a run.

    "34.6 min for the 9 notebooks (full mode, recorded 2026-12-06 on <machine>), most of it 01 (19.8 min)
    and 02 (6.3 min); the others take 32 s to 3.1 min each".

    Raises:
        ValueError: ``mode`` is neither, or the ledger holds fewer than three runs in it.
    """
    if mode not in ("full", "quick"):
        raise ValueError(f"mode must be 'full' or 'quick', got {mode!r}")
    runs = {name: e[mode] for name, e in sorted(_read(Path(folder)).items()) if isinstance(e.get(mode), dict)}
    if len(runs) < 3:
        flag = "" if mode == "full" else " --quick --record-times"
        raise ValueError(f"{folder}: {len(runs)} {mode}-mode runs recorded; run 'python -m tricks_lib run{flag}' first")
    seconds = {name[:2]: r["seconds"] for name, r in runs.items()}
    (first, a), (second, b), *others = sorted(seconds.items(), key=lambda kv: -kv[1])
    dates = sorted({r["recorded"] for r in runs.values()})
    machines = sorted({r["machine"] for r in runs.values()})
    when = dates[-1] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    rest = [s for _, s in others]
    return (
        f"{_minutes(sum(seconds.values()))} for the {len(seconds)} notebooks ({mode} mode, recorded {when} on "
        f"{' and '.join(machines)}), most of it {first} ({_minutes(a)}) and {second} ({_minutes(b)}); the others "
        f"take {_minutes(min(rest))} to {_minutes(max(rest))} each"
    )


def _minutes(seconds: float) -> str:
    """'32 s' under a minute, else '3.1 min'."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def stamp_run_time(nb, line: str | None) -> None:
    """Put ``line`` at the end of the notebook's title cell (replacing an earlier one); None removes it."""
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        return
    source = nb.cells[0].source
    if MARKER in source:
        source = source[: source.index(MARKER)].rstrip("\n")
    nb.cells[0].source = source if line is None else f"{source}\n\n{line}"


@dataclass(frozen=True)
class EarlierResults:
    """The run whose summary an output folder already holds, and whether a new run may merge into it."""

    statuses: tuple[dict, ...]
    compatible: bool
    reason: str  # why it cannot be merged ("" when it can)


# EnvInfo fields that describe the run rather than the machine: the mode is compared on its own.
_RUN_FIELDS = frozenset({"quick_mode"})


def _machine_fields(machine: Mapping) -> dict:
    """The fields that name a machine, as summary.json stores them (a tuple reads back as a list)."""
    return {k: v for k, v in json.loads(json.dumps(dict(machine), default=str)).items() if k not in _RUN_FIELDS}


def _machine_differences(earlier: Mapping, here: Mapping) -> list[str]:
    """The machine fields whose values differ; a field the earlier summary lacks (an older EnvInfo) is not one."""
    then, now = _machine_fields(earlier), _machine_fields(here)
    return [k for k in now if k in then and then[k] != now[k]]


def earlier_results(out_dir: Path, *, quick: bool, here: EnvInfo | None = None) -> EarlierResults | None:
    """Read ``out_dir/summary.json`` of an earlier run, or None when there is none (or it is unreadable).

    A run of some notebooks merges into the earlier run's summary (the other notebooks' rows are kept,
    each stamped with when it ran) only when both ran in the same mode on the same machine (every field
    of ``summary.json``'s "machine" but the mode, compared as values) and its rows carry an outcome;
    otherwise the new run replaces it, and says so. ``here``: this machine (default: ``describe()``).
    """
    path = Path(out_dir) / "summary.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        statuses, mode, summary = earlier["notebooks"], earlier["mode"], earlier["machine_summary"]
        machine = dict(earlier["machine"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    here = dataclasses.replace(here or describe(), quick_mode=quick)
    wanted = "quick" if quick else "full"
    if mode != wanted:
        return EarlierResults(tuple(statuses), False, f"was a {mode}-mode run, this one is {wanted} mode")
    differences = _machine_differences(machine, here.to_dict())
    if differences:
        # The one-line summaries name the machines; when they read the same, name what differs.
        now = _machine_fields(here.to_dict())
        detail = (
            ""
            if summary != here.summary()
            else "; " + ", ".join(f"{k} {_machine_fields(machine)[k]} then, {now[k]} now" for k in differences[:3])
        )
        return EarlierResults(tuple(statuses), False, f"ran on another machine ({summary}{detail})")
    if written_before_outcomes(earlier):
        return EarlierResults(tuple(statuses), False, "was written by an older tricks_lib (its rows carry no outcome)")
    return EarlierResults(tuple(statuses), True, "")
