"""How many verdicts change between two full runs of the main command on the same machine.

    python benchmarks/verdict_flips.py results-run1/summary.json results-run2/summary.json

A verdict "reproduces" when both runs say the same thing about a row: both faster, both slower, or
both not significant. Two kinds of change are counted apart: a *direction* flip (faster in one run,
slower in the other: never acceptable) and a *significance* flip (significant in one run, not in the
other: expected now and then for effects near the 3% threshold). Prints a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


def compare_runs(first: dict, second: dict) -> dict:
    """The flips between two ``summary.json`` documents, by (notebook, trick, variant)."""

    def by_key(summary: dict) -> dict:
        out = {}
        for row in summary["measurements"]:
            cls = verdict_class(row.get("verdict"))
            if cls is not None:
                out[(row["notebook"], row["trick"], str(row["variant"]))] = (cls, row.get("verdict"))
        return out

    a, b = by_key(first), by_key(second)
    shared = sorted(set(a) & set(b))
    direction, significance = [], []
    for key in shared:
        (ca, va), (cb, vb) = a[key], b[key]
        if ca == cb:
            continue
        entry = {"notebook": key[0], "trick": key[1], "variant": key[2], "first": va, "second": vb}
        if {ca, cb} == {"faster", "slower"}:
            direction.append(entry)
        else:
            significance.append(entry)
    return {
        "rows_compared": len(shared),
        "only_in_one_run": len(set(a) ^ set(b)),
        "direction_flips": direction,
        "significance_flips": significance,
        "significance_flip_rate": len(significance) / len(shared) if shared else 0.0,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    first, second = (json.loads(Path(p).read_text(encoding="utf-8")) for p in argv)
    print(json.dumps(compare_runs(first, second), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
