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

# The logic lives in the package (``python -m tricks_lib diff`` prints it as Markdown); this prints JSON.
from tricks_lib.summary_diff import compare_summaries


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    first, second = (json.loads(Path(p).read_text(encoding="utf-8")) for p in argv)
    print(json.dumps(compare_summaries(first, second), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
