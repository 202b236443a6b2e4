"""How many verdicts change between two full runs of the main command on the same machine.

    python benchmarks/verdict_flips.py results-run1/summary.json [results-run2/summary.json]

A verdict "reproduces" when both runs say the same thing about a row: both faster, both slower, or
both not significant. Two kinds of change are counted apart: a *direction* flip (faster in one run,
slower in the other: never acceptable) and a *significance* flip (significant in one run, not in the
other: expected now and then for effects near the 5% threshold). Beside the observed rate, the
report gives the rate that each run's own intervals predict from the noise inside a run alone.

With one summary, it prints that prediction for the run's intervals as they are and as they would be
with 4x and 9x the rounds (half and a third as wide): how far more rounds could lower the rate.
Prints a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The logic lives in the package (``python -m tricks_lib diff`` prints it as Markdown); this prints JSON.
from tricks_lib.report.summary_diff import compare_summaries, expected_significance_flips

ROUNDS_AND_WIDTHS = {"as run": 1.0, "4x the rounds": 1 / 2, "9x the rounds": 1 / 3}  # width ~ 1/sqrt(rounds)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in argv]
    if len(docs) == 2:
        report = compare_summaries(*docs)
    else:
        report = {name: expected_significance_flips(docs[0], width_scale=w) for name, w in ROUNDS_AND_WIDTHS.items()}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
