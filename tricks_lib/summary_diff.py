"""What differs between two runs' summaries: the tricks whose verdict is not the same.

    python -m tricks_lib diff results-cpu/ results-gpu/      # folders or summary.json files

Two runs on different machines (a CPU and a GPU, a laptop and Colab) show what depends on the
hardware; two runs on the same machine show which verdicts do not reproduce. A verdict is read as
its class: faster, slower or not significant (the numbers in it always move a little). Two kinds of
change are told apart: a *direction* change (faster in one run, slower in the other) and a
*significance* change (significant in one, not in the other).
"""

from __future__ import annotations

import json
from pathlib import Path

from tricks_lib.formatting import markdown_cell

__all__ = ["compare_summaries", "diff_markdown", "load_summary", "verdict_class"]


def verdict_class(verdict: str | None) -> str | None:
    """'faster', 'slower', 'not significant', or None for rows without a comparison verdict."""
    if not verdict:
        return None
    v = verdict.split(" (")[0]  # "(suspect: ...)", "(fresh replicates disagree: ...)"
    if v.endswith("x faster"):
        return "faster"
    if v.endswith("x slower"):
        return "slower"
    if v == "not significant":
        return "not significant"
    return None


def load_summary(path: str | Path) -> dict:
    """A run's ``summary.json``, from the file or the folder that holds it.

    Raises:
        FileNotFoundError: no summary.json there (run ``python -m tricks_lib run --out FOLDER`` first).
        ValueError: the file is not a summary of the main command.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no summary here; make one with `python -m tricks_lib run --out FOLDER`")
    summary = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(summary, dict) or "measurements" not in summary:
        raise ValueError(f"{path} is not a summary.json of `python -m tricks_lib run`")
    return summary


def _by_key(summary: dict) -> dict:
    out = {}
    for section in ("measurements", "verdicts"):
        for row in summary.get(section, []):
            cls = verdict_class(row.get("verdict"))
            if cls is not None:
                out[(row["notebook"], row["trick"], str(row["variant"]))] = (cls, row.get("verdict"))
    return out


def compare_summaries(first: dict, second: dict) -> dict:
    """The verdict changes between two ``summary.json`` documents, by (notebook, trick, variant)."""
    a, b = _by_key(first), _by_key(second)
    shared = sorted(set(a) & set(b))
    direction, significance = [], []
    for key in shared:
        (ca, va), (cb, vb) = a[key], b[key]
        if ca == cb:
            continue
        entry = {"notebook": key[0], "trick": key[1], "variant": key[2], "first": va, "second": vb}
        (direction if {ca, cb} == {"faster", "slower"} else significance).append(entry)
    return {
        "first_machine": first.get("machine_summary"),
        "second_machine": second.get("machine_summary"),
        "rows_compared": len(shared),
        "only_in_one_run": len(set(a) ^ set(b)),
        "direction_flips": direction,
        "significance_flips": significance,
        "significance_flip_rate": len(significance) / len(shared) if shared else 0.0,
    }


def diff_markdown(report: dict) -> str:
    """``compare_summaries``'s report as Markdown: both machines, then one line per changed verdict."""
    lines = [
        f"First run: {report['first_machine']}",
        f"Second run: {report['second_machine']}",
        "",
        f"{report['rows_compared']} verdicts in both runs; {len(report['direction_flips'])} changed direction, "
        f"{len(report['significance_flips'])} changed significance; {report['only_in_one_run']} in one run only.",
    ]
    for title, rows in (
        ("Direction changed", report["direction_flips"]),
        ("Significance changed", report["significance_flips"]),
    ):
        if rows:
            lines += [
                "",
                f"## {title}",
                "",
                "| notebook | trick | variant | first run | second run |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['notebook']} | {markdown_cell(r['trick'])} | {markdown_cell(r['variant'])} | {markdown_cell(r['first'])} | "
                f"{markdown_cell(r['second'])} |"
                for r in rows
            ]
    return "\n".join(lines) + "\n"
