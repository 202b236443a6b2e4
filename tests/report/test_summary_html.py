"""summary.html: written beside summary.json, parses, one section per notebook, a plot per comparison, escaped."""

import base64
import html
import json
from html.parser import HTMLParser

import pytest

from tricks_lib.env import describe
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.report.results import load_records, record
from tricks_lib.report.summary import NotebookStatus, write_summary_files
from tricks_lib.report.summary_html import comparison_groups, render_summary_html, speedup_plot_png
from tricks_lib.report.verdicts import VerdictTable

VOID = {"meta", "img", "br", "hr", "link", "input", "source", "col", "area", "base", "wbr"}


class Page(HTMLParser):
    """What a test reads of the page: well-nested tags, sections, images, every URL, the visible text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.problems: list[str] = []
        self.sections: list[str] = []  # section ids, in order
        self.images: dict[str, list[str]] = {}  # section id -> the src of each img in it
        self.captions: dict[str, list[str]] = {}
        self.urls: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self._caption: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self.sections.append(attrs["id"])
        if tag == "img":
            self.images.setdefault(self.sections[-1], []).append(attrs["src"])
        if tag == "figcaption":
            self._caption = []
        self.urls += [attrs[k] for k in ("src", "href") if k in attrs]
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.open[-1] if self.open else 'nothing'}")
            return
        self.open.pop()
        if tag == "figcaption":
            self.captions.setdefault(self.sections[-1], []).append("".join(self._caption))
            self._caption = None

    def handle_data(self, data):
        self.text.append(data)
        if self._caption is not None:
            self._caption.append(data)


def parse_page(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    assert page.problems == [] and page.open == [], (page.problems, page.open)
    return page


def _comparison(label, names, speedups, *, noisy_last=False):
    rows = []
    for i, (name, speedup) in enumerate(zip(names, speedups)):
        times = (1e-3 / speedup,) * 5
        if noisy_last and i == len(names) - 1:
            times = (0.5e-3, 2e-3, 1e-3, 3e-3, 0.7e-3)
        m = Measurement(name, times, 1, "cpu", 2)
        rows.append(ComparisonRow(name, m, speedup, speedup * 0.95, speedup * 1.05, i > 0, i == 0))
    return Comparison(label, names[0], tuple(rows), rounds=5, device="cpu", num_threads=2, min_effect=0.03)


@pytest.fixture
def written(tmp_path, monkeypatch):
    """A run of two notebooks: 97 with two comparisons (one with a hostile name) and a verdict, 98 failed."""
    monkeypatch.setenv("TRICKS_RESULTS", str(tmp_path / "records.jsonl"))
    monkeypatch.setenv("TRICKS_NOTEBOOK", "97_plots")
    record("plain <b>bold</b> & more", _comparison("a", ("base", "fast"), (1.0, 2.0)))
    record("<script>alert(1)</script>", _comparison("b", ("base", "x", "<i>y</i>"), (1.0, 0.5, 1.1), noisy_last=True))
    record("one measurement", Measurement("step", (1e-3,) * 5, 1, "cpu", 2))
    table = VerdictTable()
    table.add("a $dollar$ trick", _comparison("c", ("base", "fast"), (1.0, 2.0))["fast"], "never")
    statuses = [
        NotebookStatus("97_plots", True, 2.0, None, None),
        NotebookStatus("98_failed", False, 1.0, "cell 3 of 4", "RuntimeError: <boom>"),
    ]
    md, js = write_summary_files(tmp_path, describe(), statuses, load_records(tmp_path / "records.jsonl"))
    return tmp_path, json.loads(js.read_text())


def test_the_page_is_written_beside_the_json_and_holds_every_notebook_and_a_plot_per_comparison(written):
    folder, summary = written
    text = (folder / "summary.html").read_text(encoding="utf-8")
    page = parse_page(text)
    assert page.sections == ["nb-97_plots", "nb-98_failed"]
    comparisons = comparison_groups([r for r in summary["measurements"] if r["notebook"] == "97_plots"])
    assert len(comparisons) == 2
    assert len(page.images["nb-97_plots"]) == 2 and "nb-98_failed" not in page.images
    assert page.captions["nb-97_plots"] == ["plain <b>bold</b> & more", "<script>alert(1)</script>"]
    for src in page.images["nb-97_plots"]:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    # Self-contained: no script, no stylesheet link, every URL inline data, an anchor on the page, or the run's own
    # executed notebook beside it (notebooks/<name>.ipynb, linked from the digest).
    assert "script" not in page.tags and "link" not in page.tags
    executed = {f"notebooks/{s['notebook']}.ipynb" for s in summary["notebooks"]}
    assert all(u.startswith(("data:", "#")) or u in executed for u in page.urls), page.urls
    assert {u[1:] for u in page.urls if u.startswith("#")} == set(page.sections)
    # The machine stamp, the failure, every measured row and verdict appear as text.
    visible = " ".join(page.text)
    assert summary["machine_summary"] in visible
    assert "FAILED at cell 3 of 4: RuntimeError: <boom>" in visible
    assert "a $dollar$ trick" in visible and "2.00x faster" in visible
    assert "2.00x [1.90, 2.10]" in visible and "(noisy)" in visible


def test_text_from_a_run_is_escaped_never_markup(written):
    folder, _ = written
    text = (folder / "summary.html").read_text(encoding="utf-8")
    assert "<script>" not in text and "<b>bold" not in text and "<i>y" not in text and "<boom>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&amp; more" in text


def test_a_rendered_page_matches_its_json_document(written):
    # The page is a function of summary.json alone: re-rendering the written JSON gives the written page.
    folder, summary = written
    assert render_summary_html(summary) == (folder / "summary.html").read_text(encoding="utf-8")


def test_comparison_groups_follow_the_records_and_skip_other_kinds():
    def row(record, trick, variant, kind="comparison"):
        return {"notebook": "n", "record": record, "trick": trick, "variant": variant, "kind": kind}

    rows = [row(0, "a", "base"), row(0, "a", "x"), row(1, "a", "step", "measurement"), row(2, "a", "base")]
    rows += [row(2, "a", "x"), row(3, "b", "base"), row(3, "b", "x"), row(4, "b", "base")]
    groups = comparison_groups(rows)
    assert [[r["variant"] for r in g] for g in groups] == [["base", "x"], ["base", "x"], ["base", "x"], ["base"]]
    # The same trick recorded twice in a row stays two comparisons, whatever its variants are called.
    twice = [row(5, "c", "base"), row(5, "c", "x"), row(6, "c", "x"), row(6, "c", "base")]
    assert [len(g) for g in comparison_groups(twice)] == [2, 2]


def test_a_plot_needs_a_speedup_and_draws_what_lacks_an_interval():
    base = {"trick": "t", "variant": "base", "verdict": "baseline", "speedup": 1.0, "outcome": "baseline"}
    assert speedup_plot_png([base]) is None
    old = {"trick": "t", "variant": "x", "verdict": "2.00x faster", "speedup": 2.0, "outcome": "faster"}
    wide = {**old, "variant": "y", "speedup": 40.0, "speedup_low": 30.0, "speedup_high": 50.0, "noisy": True}
    for rows in ([base, old], [base, old, wide]):  # linear and log axes
        assert speedup_plot_png(rows).startswith(b"\x89PNG")


def test_the_page_opens_with_what_helped_and_hurt_here_and_wide_tables_scroll_in_their_own_box(written):
    folder, summary = written
    text = (folder / "summary.html").read_text(encoding="utf-8")
    rows = summary["measurements"]
    wins = [r for r in rows if r["outcome"] == "faster"]
    losses = [r for r in rows if r["outcome"] == "slower"]
    digest = text[text.index("<h2>On this machine</h2>") : text.index("<h2>Notebooks</h2>")]
    assert f"{len(wins)} significant wins and {len(losses)} significant losses" in digest
    assert text.index("On this machine") < text.index("<h2>Notebooks</h2>")  # the digest comes first
    for r in wins + losses:
        assert html.escape(r["variant"]) in digest
    assert text.count("<table>") == text.count('<div class="wide"><table>')  # no table widens the page
    assert ".wide{overflow-x:auto" in text


def test_a_verdict_of_several_parts_is_one_line_each_and_not_coloured_as_a_whole():
    from tricks_lib.report.summary_html import _verdict_cell

    mixed = {"verdict": "cold page cache: 1.20x slower; warm page cache: 3.00x faster", "outcome": "faster"}
    cell = _verdict_cell(mixed)
    assert 'faster"' not in cell and cell.count("<span>") == 2
    assert 'class="faster"' in _verdict_cell({"verdict": "3.00x faster", "outcome": "faster"})


def test_the_plot_shades_the_band_no_speedup_inside_can_be_significant(monkeypatch):
    import matplotlib.axes

    spans = []
    real = matplotlib.axes.Axes.axvspan
    monkeypatch.setattr(
        matplotlib.axes.Axes, "axvspan", lambda self, a, b, **k: spans.append((a, b)) or real(self, a, b, **k)
    )
    rows = [
        {"variant": "base", "outcome": "baseline", "speedup": 1.0},
        {
            "variant": "x",
            "outcome": "not significant",
            "speedup": 1.04,
            "speedup_low": 1.02,
            "speedup_high": 1.06,
            "min_effect": 0.1,
        },
    ]
    assert speedup_plot_png(rows) is not None
    assert spans == [(1 / 1.1, 1.1)]
