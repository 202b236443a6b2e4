"""Every stored closing row says what the comparison it names measured, for every variant it read.

A verdict table stores, with its rendered output, what each row read (``VerdictRow.source``: the comparison's
label, the reference, each variant's outcome), and every shown comparison stores its own outcomes
(``Comparison._repr_html_``). This test reads the stored notebooks (a full-mode run of the main command) and
checks each row that names a comparison against that comparison as the same notebook showed it, and the row's
text against the outcomes, with its own reading of the text (not the library's wording function): a row that
stands for several variants lists every one under its own outcome, the best faster one first, and its direction
is unambiguous (the subject of "faster" is the variant, followed by what it is faster than).
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def stored_metadata(path):
    """(comparisons shown: label -> list of their stored readings, closing rows) of one stored notebook."""
    shown, rows = {}, []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            for meta in output.get("metadata", {}).values():
                ours = meta.get("tricks_lib") if isinstance(meta, dict) else None
                if not ours:
                    continue
                if "verdict_rows" in ours:
                    rows.extend(ours["verdict_rows"])
                elif "comparison" in ours:
                    shown.setdefault(ours["comparison"], []).append(ours)
    return shown, rows


def expected_outcome(outcomes):
    """The outcome of a row read from ``outcomes`` (variant -> outcome): a single variant's own; else faster when
    any variant is faster, else not significant when any is not (or is suspect), else slower."""
    values = list(outcomes.values())
    if len(values) == 1:
        return values[0]
    if "faster" in values:
        return "faster"
    if {"not significant", "suspect"} & set(values):
        return "not significant"
    return "slower"


def check_text(text, source):
    """The row's text lists every variant it read under its own outcome; an AssertionError says which does not."""
    ref, outcomes, speedups = source["reference"], source["outcomes"], source["speedups"]
    than = f" than {ref}" if ref else ""
    if len(outcomes) == 1:
        (name, outcome), speedup = next(iter(outcomes.items())), next(iter(speedups.values()))
        if outcome in ("faster", "slower"):
            factor = speedup if outcome == "faster" else 1 / speedup
            assert text.startswith(f"{name}: {factor:.2f}x {outcome}{than}"), (text, outcome)
        elif outcome == "not significant":
            assert text.startswith(name) and "not significant" in text and "faster" not in text, (text, outcome)
        return
    parts = text.split("; ")
    faster = {n: s for n, s in speedups.items() if outcomes[n] == "faster"}
    if faster:
        best = max(faster, key=faster.get)
        assert parts[0] == f"{best}: {faster[best]:.2f}x faster{than} (best)", (text, best)
    else:
        assert parts[0] == f"none faster{than}", text
    listed = {}
    for part in parts[1:]:
        heading, _, names = part.partition(": ")
        for name in outcomes:
            if re.search(rf"(^|, ){re.escape(name)}( \(|,|$)", names):
                listed[name] = heading
    headings = {"faster": "also faster", "slower": "slower", "not significant": "not significant"}
    for name, outcome in outcomes.items():
        if faster and name == best:
            continue
        want = "faster but suspect" if outcome == "suspect" else headings[outcome]
        assert listed.get(name) == want, f"{text!r}: {name!r} ({outcome}) is listed under {listed.get(name)!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_closing_row_reads_the_comparison_it_names(path):
    shown, rows = stored_metadata(path)
    assert rows, f"{path.name}: no stored closing table: refresh it with 'python -m tricks_lib run --refresh'"
    for row in rows:
        source = row["source"]
        if source is None:
            continue  # a computed sentence or values, not read from a comparison
        assert row["outcome"] == expected_outcome(source["outcomes"]), row
        check_text(row["measured"], source)
        if source["comparison"] is None:
            continue  # a row read alone: its comparison is not named
        label = source["comparison"]
        assert label in shown, f"{path.name}: row {row['trick']!r} reads {label!r}, which the notebook never shows"
        if source["reference"] == shown[label][-1]["baseline"]:
            matches = [s for s in shown[label] if all(s["outcomes"].get(n) == o for n, o in source["outcomes"].items())]
            assert matches, f"{path.name}: row {row['trick']!r} disagrees with {label!r} as shown: {shown[label]}"


def test_the_text_check_catches_a_row_that_reads_one_variant_of_a_sweep():
    """02's old batch-size row: batch 32 and 128 faster, the row read batch 512 alone and said 'not significant'."""
    source = {
        "reference": "batch 8",
        "outcomes": {"batch 32": "faster", "batch 128": "faster", "batch 512": "not significant"},
        "speedups": {"batch 32": 1.33, "batch 128": 1.37, "batch 512": 0.97},
    }
    with pytest.raises(AssertionError):
        check_text("not significant; fastest: batch 32", source)
    with pytest.raises(AssertionError):  # the best by paired speedup is 128, not 32
        check_text(
            "batch 32: 1.33x faster than batch 8 (best); also faster: batch 128 (1.37x); not significant: batch 512",
            source,
        )
    check_text(
        "batch 128: 1.37x faster than batch 8 (best); also faster: batch 32 (1.33x); not significant: batch 512", source
    )
    assert expected_outcome(source["outcomes"]) == "faster"
    with pytest.raises(AssertionError):  # 04's old row: the subject is missing, the direction reads backwards
        check_text(
            "1.88x faster", {"reference": "depthwise", "outcomes": {"dense": "faster"}, "speedups": {"dense": 1.88}}
        )
