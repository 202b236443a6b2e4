"""The run summary: one frozen row type that every result renders itself into, and its three files.

Each result type owns its rows (``result.summary_rows()``), so ``record()`` takes any of them and
the writer never guesses keys. ``summary.json`` holds the machine, the notebooks' status and one
row per variant; ``summary.md`` is the same as tables; ``summary.html`` adds each comparison's
speedup plot (``tricks_lib.report.summary_html``, drawn from the same document, so the three never disagree).
The rows of the notebooks' verdict tables (``tricks_lib.report.verdicts``) go to their own list, "verdicts",
with the same keys. ``SUMMARY_ROW_KEYS`` pins the row schema (tests/report/test_summary.py checks the files
against it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tricks_lib.formatting import format_bytes, format_seconds, markdown_cell, speedup_text
from tricks_lib.outcome import SummaryRow

if TYPE_CHECKING:
    from tricks_lib.env import EnvInfo

__all__ = [
    "SUMMARY_ROW_KEYS",
    "NotebookStatus",
    "summary_rows",
    "write_summary_files",
    "written_before_outcomes",
]


class RecordLike(Protocol):
    """What the summary reads of a ``tricks_lib.report.results.Record`` (kept apart: results imports this module)."""

    notebook: str
    trick: str
    kind: str
    summary: tuple[dict, ...]  # the result's own SummaryRows, as dicts


# The keys of every row of summary.json's "measurements" (and "verdicts"), in order. "kind" is the
# result's type as recorded ("comparison", "measurement", "memory", "compile", ..., "verdict").
# "record" numbers the records of the run in order: the rows one result wrote share it (a comparison's
# variants), so nothing downstream regroups rows by adjacency.
SUMMARY_ROW_KEYS = ("notebook", "trick", "kind", "record", *(f.name for f in dataclasses.fields(SummaryRow)))


@dataclass(frozen=True)
class NotebookStatus:
    """How one notebook's run ended, as the summary shows it."""

    notebook: str
    ok: bool
    seconds: float
    failed_cell: str | None
    error: str | None
    finished_at: str = "-"  # when the notebook finished (UTC)
    carried_over: bool = False  # kept from an earlier run of the same folder, not run this time


def _time(seconds: float | None) -> str:
    return "-" if seconds is None else format_seconds(seconds)


def written_before_outcomes(summary: dict) -> bool:
    """True for a ``summary.json`` written before every row carried its ``outcome``: ``diff`` and the
    ``--only`` merge refuse it (its rows would have to be read from their sentences)."""
    return any("outcome" not in row for row in summary.get("measurements", ()))


def summary_rows(records: Sequence[RecordLike], *, verdicts: bool = False) -> list[dict]:
    """Rows of summary.json: each record's own summary rows, stamped with its names and kind.

    ``verdicts=False``: the measurements; ``True``: the rows of the notebooks' verdict tables. Every
    row has exactly ``SUMMARY_ROW_KEYS``, in order (a key an older record lacks reads None).
    """
    out = []
    for number, rec in enumerate(records):
        if (rec.kind == "verdict") != verdicts:
            continue
        for row in rec.summary:
            full = {"notebook": rec.notebook, "trick": rec.trick, "kind": rec.kind, "record": number, **row}
            out.append({key: full.get(key) for key in SUMMARY_ROW_KEYS})
    return out


def _measurement_line(r: dict) -> str:
    speedup = speedup_text(r)
    rate = f"{r['items_per_second']:,.0f}" if r["items_per_second"] is not None else "-"
    saved = format_bytes(r["saved_bytes"])
    if r["peak_saved_bytes"] is not None and r["peak_saved_bytes"] != r["saved_bytes"]:
        saved += f" ({format_bytes(r['peak_saved_bytes'])})"
    spread = _time(r["iqr_s"]) + (" (noisy)" if r.get("noisy") else "")
    return (
        f"| {markdown_cell(r['trick'])} | {markdown_cell(str(r['variant']))} | {_time(r['median_s'])} | {spread} | {rate} | "
        f"{speedup} | {markdown_cell(r['verdict'] or '-')} | {saved} | {format_bytes(r['peak_allocated_bytes'])} | "
        f"{r['device']} |"
    )


def _markdown(env: EnvInfo, statuses: Sequence[NotebookStatus], rows: list[dict], verdicts: list[dict]) -> str:
    """Grouped by notebook: its status, its verdict table, then every measured row behind it."""
    lines = [
        "# PyTorch Tricks: measured on this machine",
        "",
        env.summary(),
        "",
        "A time whose spread (IQR) is more than 10% of its median is marked *(noisy)*: read it with care. "
        "A speedup's brackets hold its paired confidence interval; `summary.html` plots them.",
        "",
        "| notebook | status | run time | finished |",
        "|---|---|---|---|",
    ]
    for s in statuses:
        status = "ok" if s.ok else markdown_cell(f"FAILED at {s.failed_cell}: {s.error}")
        finished = f"{s.finished_at} (earlier run, kept)" if s.carried_over else s.finished_at
        lines.append(f"| {s.notebook} | {status} | {s.seconds:.1f} s | {finished} |")
    order = [s.notebook for s in statuses]
    order += sorted({r["notebook"] for r in rows + verdicts} - set(order))
    for notebook in order:
        mine = [r for r in rows if r["notebook"] == notebook]
        verdict_rows = [v for v in verdicts if v["notebook"] == notebook]
        if not (mine or verdict_rows):
            continue
        lines += ["", f"## {notebook}"]
        if verdict_rows:
            lines += ["", "| trick | measured here | device |", "|---|---|---|"]
            lines += [
                f"| {markdown_cell(v['trick'])} | {markdown_cell(v['verdict'] or '-')} | {v['device']} |"
                for v in verdict_rows
            ]
        if mine:
            lines += [
                "",
                "| trick | variant | median | IQR | items/s | speedup [interval] | verdict | saved for backward "
                "(at most at once) | peak allocated by the call | device |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            lines += [_measurement_line(r) for r in mine]
    return "\n".join(lines) + "\n"


def write_summary_files(
    out_dir: Path,
    env: EnvInfo,
    statuses: Sequence[NotebookStatus],
    records: Sequence[RecordLike],
    *,
    json_only: bool = False,
    problems: Sequence[str] = (),
) -> tuple[Path, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.html`` into ``out_dir`` (each atomically).

    Returns (md, json); the HTML page is ``out_dir/summary.html`` (``tricks_lib.report.summary_html``).
    ``json_only``: write ``summary.json`` alone (the runner's progress summary, rewritten before each notebook;
    the page and its plots take seconds to draw). ``problems``: what the run could not read (e.g. a torn record
    line), listed in the summary (``"problems"``) so that nothing is dropped silently.
    """
    from tricks_lib._atomic import write_bytes_atomic
    from tricks_lib.report.summary_html import write_summary_html

    rows, verdicts = summary_rows(records), summary_rows(records, verdicts=True)
    summary = {
        "machine": env.to_dict(),
        "machine_summary": env.summary(),
        "mode": "quick" if env.quick_mode else "full",
        "notebooks": [dataclasses.asdict(s) for s in statuses],
        "measurements": rows,
        "verdicts": verdicts,
        "problems": list(problems),
    }
    json_path, md_path = Path(out_dir) / "summary.json", Path(out_dir) / "summary.md"
    text = json.dumps(summary, indent=2, default=str, allow_nan=False) + "\n"
    write_bytes_atomic(json_path, text.encode("utf-8"))
    if json_only:
        return md_path, json_path
    write_bytes_atomic(md_path, _markdown(env, statuses, rows, verdicts).encode("utf-8"))
    write_summary_html(out_dir, summary)
    return md_path, json_path
