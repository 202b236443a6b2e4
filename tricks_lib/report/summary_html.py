"""``summary.html``: the run summary as one page a reader opens first, with each comparison's speedup plot.

Drawn from the ``summary.json`` document itself (``render_summary_html(summary)``), so the page, the
JSON and the Markdown list the same rows, also after a subset run merged into an earlier one. The
page is self-contained: inline CSS, the plots as inline PNG (base64), no scripts, nothing fetched;
it opens offline. Every text from a run (trick names, variants, errors) is HTML-escaped.

Layout: the machine stamp, a digest of what helped and hurt on this machine (each significant row, linked to its
section and executed notebook), a table of the notebooks (status, run time, when it finished) linking to
one section per notebook; each section holds the notebook's verdict table, then its measured rows
(effect on this machine, paired interval, significance, spread with the noisy flag, memory), then a
speedup plot per comparison: each variant's speedup against the baseline with its paired interval,
on a log axis when the speedups span more than 3x.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path

from tricks_lib.formatting import format_bytes, format_seconds, speedup_text
from tricks_lib.outcome import Outcome
from tricks_lib.stats import DEFAULT_MIN_EFFECT

__all__ = [
    "SUMMARY_HTML_NAME",
    "comparison_groups",
    "render_summary_html",
    "speedup_plot_png",
    "write_summary_html",
]

SUMMARY_HTML_NAME = "summary.html"
TITLE = "PyTorch Tricks: measured on this machine"
_FASTER, _SLOWER, _UNCLEAR = "#2e7d32", "#c62828", "#757575"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem auto;max-width:78rem;
padding:0 1rem;color:#1f2328;line-height:1.4}
h1{font-size:1.6rem;margin-bottom:.3rem}h2{margin-top:2.2rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
table{border-collapse:collapse;margin:.3rem 0 1rem;font-size:.86rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.machine{font-weight:600}.note{color:#57606a;font-size:.9rem}
.ok{color:#1a7f37}.fail{color:#cf222e;font-weight:600}.kept{color:#57606a}
.noisy{color:#9a6700;font-weight:600}.faster{color:#1a7f37}.slower{color:#cf222e}
.plots{display:flex;flex-wrap:wrap;gap:.6rem 1.4rem;align-items:flex-start}
figure{margin:.3rem 0;max-width:37rem}figure img{max-width:100%;height:auto;border:1px solid #eaeef2}
td.trick{font-weight:600;background:#fbfcfd}
figcaption{font-size:.88rem;font-weight:600;margin-bottom:.15rem}
.wide{overflow-x:auto;max-width:100%}.wide table{margin-top:0}
td.parts span{display:block}
"""


def _e(value) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _anchor(notebook: str) -> str:
    return "nb-" + re.sub(r"[^A-Za-z0-9_-]", "-", notebook)


def comparison_groups(rows: Sequence[dict]) -> list[list[dict]]:
    """The rows of each recorded comparison, in order: the rows of kind "comparison" that one record wrote."""
    groups: dict[int, list[dict]] = {}
    for row in rows:
        if row.get("kind") == "comparison":
            groups.setdefault(row["record"], []).append(row)
    return list(groups.values())


def _plain(text: str) -> str:
    """Text for matplotlib: a '$' would start mathtext."""
    return str(text).replace("$", r"\$")


def _short(text: str, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Readable ticks for a log axis over [lo, hi]: 1-1.5-2-3-5-7 per decade, thinned to 1-2-5 when crowded."""
    import math

    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for steps in ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,)):
        ticks = [k * 10.0**d for d in decades for k in steps if lo <= k * 10.0**d <= hi]
        if len(ticks) <= 8:
            return ticks + [1.0] if 1.0 not in ticks and lo <= 1.0 <= hi else ticks
    return ticks


def _color(row: dict) -> str:
    return {Outcome.FASTER: _FASTER, Outcome.SLOWER: _SLOWER}.get(row.get("outcome"), _UNCLEAR)


def speedup_plot_png(rows: Sequence[dict], *, dpi: int = 80) -> bytes | None:
    """One comparison's speedup plot as PNG bytes, or None when no variant has a speedup to draw.

    Each non-baseline variant is a dot at its speedup (hollow when its time is noisy) with a bar over
    its paired interval, coloured by significance (green faster, red slower, grey not significant);
    a dashed line marks 1x (the baseline); the verdict stands at the right edge, never over a bar.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    points = [r for r in rows if r.get("outcome") != Outcome.BASELINE and r.get("speedup") is not None]
    if not points:
        return None
    baseline = next((r["variant"] for r in rows if r.get("outcome") == Outcome.BASELINE), "the baseline")
    fig = Figure(figsize=(7.0, 0.95 + 0.34 * len(points)), dpi=dpi)
    ax = fig.subplots()
    values = [1.0]
    for y, r in enumerate(points):
        low, high = r.get("speedup_low"), r.get("speedup_high")
        color = _color(r)
        if low is not None and high is not None:
            ax.plot([low, high], [y, y], color=color, linewidth=3, solid_capstyle="butt", alpha=0.55)
            values += [low, high]
        ax.plot([r["speedup"]], [y], "o", color=color, markerfacecolor="white" if r.get("noisy") else color)
        values.append(r["speedup"])
    ax.axvline(1.0, color="0.35", linewidth=1, linestyle="--")
    # The comparison's threshold: an interval that stays inside this band around 1x is never "significant".
    effect = next((r["min_effect"] for r in points if r.get("min_effect") is not None), DEFAULT_MIN_EFFECT)
    ax.axvspan(1 / (1 + effect), 1 + effect, color="0.5", alpha=0.12, linewidth=0)
    values += [1 / (1 + effect), 1 + effect]
    lo, hi = min(values), max(values)
    if hi / lo > 3:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(_log_ticks(lo, hi)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    pad = (hi / lo) ** 0.08 if hi / lo > 3 else None
    ax.set_xlim(lo / pad, hi * pad) if pad else ax.set_xlim(lo - 0.06 * (hi - lo + 0.05), hi + 0.06 * (hi - lo + 0.05))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks(range(len(points)), [_plain(_short(r["variant"])) for r in points])
    ax.set_ylim(len(points) - 0.5, -0.5)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    verdicts = [_short(r.get("verdict") or "-", 48) + (", noisy" if r.get("noisy") else "") for r in points]
    right.set_yticks(range(len(points)), [_plain(v) for v in verdicts], fontsize=8)
    right.tick_params(length=0)
    ax.set_xlabel(
        _plain(
            f"speedup vs {_short(baseline, 40)} (> 1x: faster); bars: paired interval; "
            f"shaded: within {effect:.0%} of 1x, never significant"
        ),
        fontsize=9,
    )
    ax.grid(axis="x", color="0.9")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def _status_cell(s: dict) -> str:
    if s.get("ok"):
        return '<span class="ok">ok</span>'
    return (
        f'<span class="fail">FAILED at {_e(s.get("failed_cell") or "before any cell ran")}: {_e(s.get("error"))}</span>'
    )


def _finished(s: dict) -> str:
    text = _e(s.get("finished_at"))
    return f'{text} <span class="kept">(earlier run, kept)</span>' if s.get("carried_over") else text


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A table from already escaped cells; a cell starting with '<td' is taken as written."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    rows = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>" for cells in body
    )
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _num(text: str) -> str:
    return f'<td class="num">{text}</td>'


def _verdict_cell(row: dict) -> str:
    """The verdict, coloured by the row's outcome. A verdict of several parts ("cold page cache: ...; warm page
    cache: ...", "accuracy: ...; speed: ...") shows each part on its own line, uncoloured: one outcome cannot
    speak for parts that may disagree."""
    v = row.get("verdict") or "-"
    parts = [p for p in v.split("; ") if p]
    if len(parts) > 1:
        return '<td class="parts">' + "".join(f"<span>{_e(p)}</span>" for p in parts) + "</td>"
    cls = {Outcome.FASTER: "faster", Outcome.SLOWER: "slower"}.get(row.get("outcome"), "")
    return f'<td class="{cls}">{_e(v)}</td>' if cls else f"<td>{_e(v)}</td>"


def _measurement_cells(r: dict) -> list[str]:
    spread = _e("-" if r.get("iqr_s") is None else format_seconds(r["iqr_s"]))
    if r.get("noisy"):
        spread += ' <span class="noisy">(noisy)</span>'
    saved = format_bytes(r.get("saved_bytes"))
    if r.get("peak_saved_bytes") is not None and r["peak_saved_bytes"] != r.get("saved_bytes"):
        saved += f" ({format_bytes(r['peak_saved_bytes'])})"
    significant = {True: "yes", False: "no"}.get(r.get("significant"), "-")
    rate = "-" if r.get("items_per_second") is None else f"{r['items_per_second']:,.0f}"
    return [
        _e(r["variant"]),
        _num(_e("-" if r.get("median_s") is None else format_seconds(r["median_s"]))),
        _num(spread),
        _num(_e(rate)),
        _num(_e(speedup_text(r))),
        _e(significant),
        _verdict_cell(r),
        _num(_e(saved)),
        _num(_e(format_bytes(r.get("peak_allocated_bytes")))),
        _e(r.get("device")),
    ]


_MEASUREMENT_HEADER = (
    "trick",
    "variant",
    "median",
    "spread (IQR)",
    "items/s",
    "speedup [paired interval]",
    "significant",
    "effect on this machine",
    "saved for backward (at most at once)",
    "peak allocated by the call",
    "device",
)


def _section(notebook: str, status: dict | None, rows: list[dict], verdicts: list[dict]) -> str:
    parts = [f'<section id="{_e(_anchor(notebook))}">', f"<h2>{_e(notebook)}</h2>"]
    if status is not None:
        parts.append(f"<p>{_status_cell(status)}; {status.get('seconds', 0):.1f} s; finished {_finished(status)}</p>")
    if verdicts:
        parts.append("<h3>Verdicts</h3>")
        parts.append(
            _table(
                ("trick", "measured here", "device"),
                [[_e(v["trick"]), _verdict_cell(v), _e(v.get("device"))] for v in verdicts],
            )
        )
    if rows:
        parts.append("<h3>Measurements</h3>")
        body = []
        for i, r in enumerate(rows):
            cells = _measurement_cells(r)
            if i == 0 or rows[i - 1]["trick"] != r["trick"]:
                span = next((j for j in range(i, len(rows)) if rows[j]["trick"] != r["trick"]), len(rows)) - i
                cells.insert(0, f'<td rowspan="{span}" class="trick">{_e(r["trick"])}</td>')
            body.append(cells)
        parts.append(_table(_MEASUREMENT_HEADER, body))
    figures = []
    for group in comparison_groups(rows):
        png = speedup_plot_png(group)
        if png is None:
            continue
        data = base64.b64encode(png).decode("ascii")
        trick = group[0]["trick"]
        figures.append(
            f'<figure class="speedup"><figcaption>{_e(trick)}</figcaption>'
            f'<img src="data:image/png;base64,{data}" alt="{_e(f"speedup plot: {trick}")}"></figure>'
        )
    if figures:
        parts += ["<h3>Speedup plots</h3>", '<div class="plots">', *figures, "</div>"]
    if not (rows or verdicts):
        parts.append('<p class="note">No measurements recorded.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _digest(rows: list[dict], executed: set[str]) -> list[str]:
    """The page's start: every significant win and loss of this run, largest first, each linked to its section and
    to its executed notebook."""
    wins = sorted((r for r in rows if r.get("outcome") == Outcome.FASTER), key=lambda r: -(r.get("speedup") or 0))
    losses = sorted((r for r in rows if r.get("outcome") == Outcome.SLOWER), key=lambda r: r.get("speedup") or 0)
    parts = [
        "<h2>On this machine</h2>",
        f'<p class="note">{len(wins)} significant wins and {len(losses)} significant losses among {len(rows)} measured '
        "rows (the rest: baselines and differences too small to call). Each links to its notebook's section and to "
        "the executed notebook.</p>",
    ]
    for title, chosen in (("Helped", wins), ("Hurt", losses)):
        if not chosen:
            parts.append(f'<h3>{title}</h3><p class="note">None in this run.</p>')
            continue
        body = []
        for r in chosen:
            name = r["notebook"]
            link = f'<a href="#{_e(_anchor(name))}">{_e(name)}</a>'
            if name in executed:
                link += f' (<a href="notebooks/{_e(name)}.ipynb">notebook</a>)'
            body.append([_e(r["trick"]), _e(r["variant"]), _verdict_cell(r), _num(_e(speedup_text(r))), link])
        parts += [
            f"<h3>{title}</h3>",
            _table(("trick", "variant", "effect", "speedup [paired interval]", "where"), body),
        ]
    return parts


def render_summary_html(summary: dict) -> str:
    """The page for one ``summary.json`` document (as ``write_summary_files`` writes it)."""
    statuses = list(summary.get("notebooks", []))
    rows, verdicts = list(summary.get("measurements", [])), list(summary.get("verdicts", []))
    order = [s["notebook"] for s in statuses]
    order += sorted({r["notebook"] for r in rows + verdicts} - set(order))
    by_name = {s["notebook"]: s for s in statuses}
    machine = summary.get("machine") or {}
    machine_rows = [
        [_e(k), _e(", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v)] for k, v in machine.items()
    ]
    index = [
        [
            f'<a href="#{_e(_anchor(name))}">{_e(name)}</a>',
            _status_cell(by_name[name]) if name in by_name else "-",
            _num(f"{by_name[name]['seconds']:.1f} s" if name in by_name else "-"),
            _finished(by_name[name]) if name in by_name else "-",
            _num(str(sum(r["notebook"] == name for r in rows))),
        ]
        for name in order
    ]
    body = [
        f"<h1>{_e(TITLE)}</h1>",
        f'<p class="machine">{_e(summary.get("machine_summary"))}</p>',
        f'<p class="note">{_e(summary.get("mode"))} mode. A time whose spread (IQR) is more than 10% of its '
        'median is marked <span class="noisy">(noisy)</span>: read it with care. A speedup is significant when '
        "its paired confidence interval clears the comparison's threshold; the plots draw that interval. "
        "The same rows are in summary.json and summary.md.</p>",
        "<details><summary>Machine details</summary>" + _table(("field", "value"), machine_rows) + "</details>",
        *_digest(rows, {s["notebook"] for s in statuses}),
        "<h2>Notebooks</h2>",
        _table(("notebook", "status", "run time", "finished", "measured rows"), index),
        *(
            _section(
                name,
                by_name.get(name),
                [r for r in rows if r["notebook"] == name],
                [v for v in verdicts if v["notebook"] == name],
            )
            for name in order
        ),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(TITLE)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def write_summary_html(out_dir: str | Path, summary: dict) -> Path:
    """Write ``out_dir/summary.html`` for ``summary`` atomically; returns its path.

    Raises:
        FileNotFoundError: ``out_dir`` does not exist.
    """
    from tricks_lib._atomic import write_bytes_atomic

    return write_bytes_atomic(Path(out_dir) / SUMMARY_HTML_NAME, render_summary_html(summary).encode("utf-8"))
