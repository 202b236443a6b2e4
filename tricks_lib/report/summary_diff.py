"""What differs between two runs' summaries: the tricks whose verdict is not the same.

    python -m tricks_lib diff results-cpu/ results-gpu/      # folders or summary.json files

Two runs on different machines (a CPU and a GPU, a laptop and Colab) show what depends on the
hardware; two runs on the same machine show which verdicts do not reproduce. A verdict is read as
its outcome: faster, slower or not significant (the numbers in it always move a little), which every
row carries as a value (``outcome``), so nothing here reads a sentence. Two kinds of
change are told apart: a *direction* change (faster in one run, slower in the other) and a
*significance* change (significant in one, not in the other).

Significance changes are expected for rows near the threshold even when nothing but the noise inside
a run acts: ``expected_significance_flips`` reads, from one run's own paired intervals, how many
rows an independent rerun would flip that way. Observed changes well above that number point to
noise *between* runs (state a run draws once: its processes, the host's load), which the intervals
cannot see.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from statistics import NormalDist

from tricks_lib._validate import check_positive
from tricks_lib.formatting import markdown_cell
from tricks_lib.outcome import Outcome
from tricks_lib.report.summary import written_before_outcomes
from tricks_lib.stats import CONFIDENCE, DEFAULT_MIN_EFFECT

__all__ = ["compare_summaries", "diff_markdown", "expected_significance_flips", "load_summary", "verdict_class"]


def verdict_class(row: dict) -> str | None:
    """A summary row's outcome as the diff reads it: 'faster', 'slower', 'not significant', or None for rows
    that are not a comparison's variant (the baseline, a memory report, a sentence of a verdict table).

    A suspect row (faster although it does more work) counts as not significant: it is not a speedup.
    """
    outcome = row.get("outcome")
    if outcome in (Outcome.FASTER, Outcome.SLOWER, Outcome.NOT_SIGNIFICANT):
        return str(Outcome(outcome))
    return "not significant" if outcome == Outcome.SUSPECT else None


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
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # a torn or edited file: one line, not a traceback
        raise ValueError(f"{path} is not readable JSON ({err}); rerun `python -m tricks_lib run --out FOLDER`") from err
    if not isinstance(summary, dict) or "measurements" not in summary:
        raise ValueError(f"{path} is not a summary.json of `python -m tricks_lib run`")
    for section in ("measurements", "verdicts"):
        rows = summary.get(section, [])
        bad = next(
            (i for i, r in enumerate(rows) if not (isinstance(r, dict) and {"notebook", "trick", "variant"} <= set(r))),
            None,
        ) if isinstance(rows, list) else 0  # fmt: skip
        if bad is not None:
            raise ValueError(
                f"{path}: {section} row {bad} is not a result row (it needs notebook, trick and variant); "
                "the file was edited or written by another tool"
            )
    if written_before_outcomes(summary):
        raise ValueError(
            f"{path} was written by an older tricks_lib (its rows carry no outcome): rerun that folder with "
            "`python -m tricks_lib run --out FOLDER` before comparing it"
        )
    return summary


def _verdict_rows(summary: dict) -> dict:
    """Each row with a comparison verdict, by (notebook, trick, variant)."""
    out = {}
    for section in ("measurements", "verdicts"):
        for row in summary.get(section, []):
            if verdict_class(row) is not None:
                out[(row["notebook"], row["trick"], str(row["variant"]))] = row
    return out


def _by_key(summary: dict) -> dict:
    return {key: (verdict_class(row), row["verdict"]) for key, row in _verdict_rows(summary).items()}


_NORMAL = NormalDist()
_Z = _NORMAL.inv_cdf(0.5 + CONFIDENCE / 2)  # 2.576 at 99%: the interval's half-width in standard errors


def _chance_significant(speedup: float, low: float, high: float, min_effect: float, width_scale: float) -> float:
    """The chance that a rerun's interval clears the threshold, the rerun's log speedup drawn around this one's.

    The spread of the draw is what this interval implies (its log width over 2 z), and the rerun's
    interval keeps this one's width and skew; both scale with ``width_scale``.
    """
    m, lo, hi = math.log(speedup), math.log(low), math.log(high)
    below, above = (m - lo) * width_scale, (hi - m) * width_scale
    sigma = (below + above) / (2 * _Z)
    edge = math.log1p(min_effect)
    if sigma <= 0:
        return 1.0 if (m - below >= edge or m + above <= -edge) else 0.0
    return _NORMAL.cdf((m - below - edge) / sigma) + _NORMAL.cdf((-edge - above - m) / sigma)


def expected_significance_flips(
    summary: dict,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    width_scale: float = 1.0,
    keys: Iterable[tuple] | None = None,
) -> dict:
    """How many rows two independent reruns would call differently (significant or not), from this run's intervals.

    For each row with a paired interval, a rerun's log speedup is drawn around this run's with the
    spread its 99% interval implies; ``p`` is the chance that the rerun's interval clears
    ``min_effect``, and two reruns disagree with chance ``2 p (1 - p)``. Only the noise between the
    rounds of one run enters (and neither the replicate rule nor the ratio-of-medians rule), so this
    is the floor that more rounds lower: ``width_scale=0.5`` reads the same rows with intervals half
    as wide (about 4x the rounds). ``keys``: only these (notebook, trick, variant) rows.

    Returns a dict: ``rows`` read, ``expected_flips`` (their sum), ``expected_flip_rate``, and
    ``rows_without_interval`` (verdicts with no paired interval, e.g. text rows, left out).

    Raises:
        TypeError: ``min_effect`` or ``width_scale`` is not a number.
        ValueError: ``min_effect`` is not in [0, 1) or ``width_scale`` not in (0, 1].
    """
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)):
        raise TypeError(f"min_effect must be a number, got {min_effect!r}")
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be a fraction in [0, 1) (0.05: 5%), got {min_effect!r}")
    check_positive(width_scale, "width_scale", allow_none=False)
    if width_scale > 1:
        raise ValueError(f"width_scale must be at most 1 (0.5: intervals half as wide), got {width_scale!r}")
    rows = _verdict_rows(summary)
    wanted = set(rows) if keys is None else set(keys) & set(rows)
    total, read, missing = 0.0, 0, 0
    for key in wanted:
        row = rows[key]
        values = (row.get("speedup"), row.get("speedup_low"), row.get("speedup_high"))
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
            missing += 1
            continue
        p = _chance_significant(*values, min_effect, width_scale)
        total += 2 * p * (1 - p)
        read += 1
    return {
        "rows": read,
        "expected_flips": total,
        "expected_flip_rate": total / read if read else 0.0,
        "rows_without_interval": missing,
    }


# What makes two runs' numbers incomparable as a rerun, in the order the report names them.
_SETTINGS = (
    ("mode", lambda s: s.get("mode")),
    ("device", lambda s: (s.get("machine") or {}).get("device_name")),
    ("CPU threads", lambda s: (s.get("machine") or {}).get("num_threads")),
    ("torch", lambda s: (s.get("machine") or {}).get("torch")),
)


def setting_differences(first: dict, second: dict) -> list[str]:
    """What differs between two runs' settings (mode, device, threads, torch), as "name: first -> second"."""
    out = []
    for name, read in _SETTINGS:
        a, b = read(first), read(second)
        if a != b and (a is not None or b is not None):
            out.append(f"{name}: {a} -> {b}")
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
    expected = [expected_significance_flips(doc, keys=shared) for doc in (first, second)]
    return {
        "first_machine": first.get("machine_summary"),
        "second_machine": second.get("machine_summary"),
        "settings_differ": setting_differences(first, second),
        "rows_compared": len(shared),
        "only_in_one_run": len(set(a) ^ set(b)),
        "direction_flips": direction,
        "significance_flips": significance,
        "significance_flip_rate": len(significance) / len(shared) if shared else 0.0,
        # From each run's own intervals: what within-run noise alone would give (see above), over the
        # shared rows that have an interval (text verdicts have none).
        "expected_significance_flips": {
            "first": expected[0]["expected_flips"],
            "second": expected[1]["expected_flips"],
        },
        "rows_with_interval": {"first": expected[0]["rows"], "second": expected[1]["rows"]},
        "expected_significance_flip_rate": {
            "first": expected[0]["expected_flip_rate"],
            "second": expected[1]["expected_flip_rate"],
        },
    }


def diff_markdown(report: dict) -> str:
    """``compare_summaries``'s report as Markdown: both machines, then one line per changed verdict."""
    lines = [
        f"First run: {report['first_machine']}",
        f"Second run: {report['second_machine']}",
        "",
    ]
    if report.get("settings_differ"):
        lines += [
            "**Not a rerun of the same setup**: " + "; ".join(report["settings_differ"]) + ". Changed verdicts below "
            "may come from that difference (sizes, hardware, library), not from noise.",
            "",
        ]
    lines += [
        f"{report['rows_compared']} verdicts in both runs; {len(report['direction_flips'])} changed direction, "
        f"{len(report['significance_flips'])} changed significance; {report['only_in_one_run']} in one run only.",
    ]
    expected, with_interval = report.get("expected_significance_flips"), report.get("rows_with_interval")
    if expected and report["rows_compared"]:
        # Counts, not rates: the prediction covers only the rows with an interval, the observed count all rows.
        lines.append(
            f"The noise inside one run alone would change the significance of about {expected['first']:.1f} of the "
            f"{with_interval['first']} rows with an interval (first run's intervals) or {expected['second']:.1f} of "
            f"{with_interval['second']} (second run's); many more changes than that point to noise between runs."
        )
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
