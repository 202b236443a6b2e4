"""The what-to-copy cell: lines of the tricks that helped in this run, then the others and why."""

import pytest
from known_results import known_comparison

from tricks_lib import Comparison, Outcome
from tricks_lib.report.copy_list import CopyItem, CopyList
from tricks_lib.report.verdicts import VerdictTable


def _comparison(speedup_of_fast: float) -> Comparison:
    """A baseline and one variant ``speedup_of_fast`` times faster in every round (clearly significant)."""
    return known_comparison({"slow": 4e-3, "fast": 4e-3 / speedup_of_fast}, "slow")


def test_a_faster_row_is_on_the_helped_list_and_a_slower_one_is_not():
    table = VerdictTable(record_rows=False)
    table.add("trick a", _comparison(2.0), "never", copy="    x = a(x)\n")
    table.add("trick b", _comparison(0.5), "always", copy="x = b(x)")
    table.add("no lines", _comparison(2.0), "never")
    listed = table.what_to_copy()
    assert [i.trick for i in listed.helped] == ["trick a"]
    assert [i.trick for i in listed.not_helped] == ["trick b"]
    assert listed.helped[0].lines == "x = a(x)"  # dedented and stripped
    md, meta = listed._repr_markdown_()
    assert "x = a(x)" in md.split("Did not help")[0] and "x = b(x)" not in md
    assert "trick b" in md.split("Did not help")[1] and "always" in md
    assert [d["helped"] for d in meta["tricks_lib"]["what_to_copy"]] == [True, False]
    assert table.rows[0].outcome is Outcome.FASTER and table.rows[0].helped_from == "outcome"


def test_a_row_not_read_from_a_comparison_needs_a_computed_helped():
    table = VerdictTable(record_rows=False)
    with pytest.raises(ValueError, match="helped="):
        table.add("freeze", "saved 3 MiB", "nothing frozen", copy="p.requires_grad_(False)")
    row = table.add("freeze", "saved 3 MiB", "nothing frozen", copy="p.requires_grad_(False)", helped=True)
    assert row.helped and row.helped_from == "computed"
    with pytest.raises(TypeError, match="bool"):
        table.add("freeze", "saved 3 MiB", "nothing frozen", copy="p", helped=1)
    with pytest.raises(TypeError, match="string"):
        table.add("freeze", "saved 3 MiB", "nothing frozen", copy=["p"], helped=True)


def test_nothing_helped_says_so_and_an_empty_list_is_refused():
    table = VerdictTable(record_rows=False)
    table.add("trick b", _comparison(0.5), "always", copy="x = b(x)")
    assert "None of the 1 tricks" in table.what_to_copy().to_markdown()
    with pytest.raises(ValueError, match="copy="):
        VerdictTable(record_rows=False).what_to_copy()
    with pytest.raises(TypeError):
        CopyList([CopyItem("a", "x", "m", "c", True)])
