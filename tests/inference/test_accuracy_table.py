"""tricks_lib.inference.accuracy_table: lossy variants' accuracy, error and size against one fp32 reference."""

import pytest
import torch

from tricks_lib.inference.accuracy_table import AccuracyCost, AccuracyTable
from tricks_lib.inference.conversions import output_error


def test_rows_read_against_the_reference():
    table = AccuracyTable(0.98, label="digits", reference_size_bytes=4000)
    reference = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    row = table.add("int8", 0.965, error=output_error(reference, reference + 0.5), size_bytes=1000)
    assert isinstance(row, AccuracyCost) and table["int8"] is row and len(table) == 1
    assert row.change == pytest.approx(-0.015) and row.text == "96.5% (fp32 98.0%)"
    text = table.to_markdown()
    assert text.startswith("digits") and "-1.5" in text and "0.5 (3)" in text and "100.0%" in text
    assert "1000 B" in text and "3.91 KiB" in text  # sizes: the variant's and the reference's
    assert table._repr_html_().startswith("<table>") and "int8" in repr(row)


def test_columns_no_row_fills_are_left_out():
    table = AccuracyTable(0.9)
    table.add("1-bit", 0.5)
    header = table.to_markdown().splitlines()[0]
    assert "test accuracy" in header and "size" not in header and "agreement" not in header and "note" not in header


def test_bad_rows_are_refused():
    table = AccuracyTable(0.9)
    table.add("a", 0.8)
    with pytest.raises(ValueError, match="already"):
        table.add("a", 0.7)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        table.add("b", 97.0)
    with pytest.raises(TypeError, match="fraction"):
        table.add("b", "97%")
    with pytest.raises(TypeError, match="OutputError"):
        table.add("b", 0.5, error=0.1)
    with pytest.raises(ValueError, match="negative"):
        table.add("b", 0.5, size_bytes=-1)
    with pytest.raises(KeyError, match="variants are"):
        table["missing"]
    with pytest.raises(ValueError):
        AccuracyTable(1.5)
