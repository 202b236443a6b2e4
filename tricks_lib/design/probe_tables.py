"""ShuffleNet V2's Tables 1-4 (Ma et al. 2018) and this machine's timings of the probe networks read against them.

``SHUFFLENET_V2_TABLES`` holds the paper's throughputs (GPU: GTX 1080Ti, batches/s; ARM: Snapdragon
810, one thread, images/s) for the ``x1, x2, x4`` columns of each row, copied from the paper's
Tables 1-4; ``paper_throughput_ratios(guideline, row, multiplier)`` gives a row's throughput over its
table's first row. ``trend_against_paper(paper_ratio, row)`` reads a measured comparison row's paired
interval against the paper's throughput ratio ("holds", "stronger", "weaker", "inverts", "not resolved
here"). ``ProbeTable`` is one table timed here (the probe networks, written out in notebook 04), at the paper's
thread count and optionally at the machine's default one; ``ProbeTrends`` every timed table side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tricks_lib.formatting import markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow
from tricks_lib.stats import CONFIDENCE

__all__ = ["SHUFFLENET_V2_TABLES", "ProbeTable", "ProbeTrends", "paper_throughput_ratios", "trend_against_paper"]

# The paper's numbers, row -> (GPU x1, x2, x4 in batches/s; ARM x1, x2, x4 in images/s).
# Table 2 and 3 head their ARM columns "CPU"; the text says all ARM runs used a Snapdragon 810.
SHUFFLENET_V2_TABLES: dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    "G1": {
        "1:1": ((1480, 723, 232), (76.2, 21.7, 5.3)),
        "1:2": ((1296, 586, 206), (72.9, 20.5, 5.1)),
        "1:6": ((876, 489, 189), (69.1, 17.9, 4.6)),
        "1:12": ((748, 392, 163), (57.6, 15.1, 4.4)),
    },
    "G2": {
        "g=1": ((2451, 1289, 437), (40.0, 10.2, 2.3)),
        "g=2": ((1725, 873, 341), (35.0, 9.5, 2.2)),
        "g=4": ((1026, 644, 338), (32.9, 8.7, 2.1)),
        "g=8": ((634, 445, 230), (27.8, 7.5, 1.8)),
    },
    "G3": {
        "1-fragment": ((2446, 1274, 434), (40.2, 10.1, 2.3)),
        "2-fragment-series": ((1790, 909, 336), (38.6, 10.1, 2.2)),
        "4-fragment-series": ((752, 745, 349), (38.4, 10.1, 2.3)),
        "2-fragment-parallel": ((1537, 803, 320), (33.4, 9.1, 2.2)),
        "4-fragment-parallel": ((691, 572, 292), (35.0, 8.4, 2.1)),
    },
    "G4": {
        "ReLU + shortcut": ((2427, 2066, 1436), (56.7, 16.9, 5.0)),
        "ReLU, no shortcut": ((2647, 2256, 1735), (61.9, 18.8, 5.2)),
        "shortcut, no ReLU": ((2672, 2121, 1458), (57.3, 18.2, 5.1)),
        "neither": ((2842, 2376, 1782), (66.3, 20.2, 5.4)),
    },
}


def paper_throughput_ratios(guideline: str, row: str, multiplier: int) -> tuple[float, float]:
    """The paper's throughput of ``row`` over its table's first row, ``(GPU half, ARM half)``.

    Args:
        guideline: "G1" to "G4" (the keys of ``SHUFFLENET_V2_TABLES``).
        row: a row name of that table, e.g. "1:12" or "g=8".
        multiplier: the width column, 1, 2 or 4.

    Raises:
        KeyError: an unknown guideline or row (the message lists the valid ones).
        ValueError: a multiplier other than 1, 2 or 4.
    """
    if guideline not in SHUFFLENET_V2_TABLES:
        raise KeyError(f"guideline must be one of {sorted(SHUFFLENET_V2_TABLES)}, got {guideline!r}")
    table = SHUFFLENET_V2_TABLES[guideline]
    if row not in table:
        raise KeyError(f"{guideline} has rows {list(table)}, got {row!r}")
    if multiplier not in (1, 2, 4):
        raise ValueError(f"multiplier must be 1, 2 or 4 (the paper's width columns), got {multiplier!r}")
    column = {1: 0, 2: 1, 4: 2}[multiplier]
    first = next(iter(table.values()))
    gpu, arm = (table[row][half][column] / first[half][column] for half in (0, 1))
    return gpu, arm


def trend_against_paper(paper_ratio: float, row: ComparisonRow) -> str:
    """How this machine's paired interval of the throughput ratio (``row.ci_low`` to ``row.ci_high``, against the
    table's first row) reads the paper's ratio.

    Returns one of:

    * "holds": the paper's ratio lies inside the interval and the row is significant (the run sees an
      effect, and the paper's size is one it allows);
    * "stronger": the whole interval lies beyond the paper's ratio, further from 1x in the same direction;
    * "weaker": the whole interval lies between 1x and the paper's ratio, and the row is significant;
      "weaker (none significant here)" when the row is not significant;
    * "inverts": significant, in the other direction from the paper's;
    * "not resolved here": the interval holds the paper's ratio but the row is not significant (the interval
      reaches 1x, or comes closer to it than the comparison's smallest effect, so the run calls no effect),
      or the run has no interval (too few rounds).

    Where the paper measured no difference (a ratio of exactly 1, as some of its rows do): "no effect in the
    paper, none here" or "no effect in the paper, one here" (from ``row.significant``).

    Raises:
        TypeError: ``row`` is not a ``ComparisonRow``.
        ValueError: ``paper_ratio`` is not a positive number.
    """
    if not isinstance(row, ComparisonRow):
        raise TypeError(f"row must be a ComparisonRow (a row of compare()'s result), got {type(row).__name__}")
    if isinstance(paper_ratio, bool) or not isinstance(paper_ratio, (int, float)) or not paper_ratio > 0:
        raise ValueError(f"paper_ratio must be a positive throughput ratio, got {paper_ratio!r}")
    if paper_ratio == 1:
        return "no effect in the paper, one here" if row.significant else "no effect in the paper, none here"
    if not (row.ci_low > 0 and row.ci_high > 0):  # NaN (too few rounds for an interval) or a broken row
        return "not resolved here"
    # Log ratios, signed so that the paper's effect is positive: a larger value is a stronger effect.
    sign = 1.0 if paper_ratio > 1 else -1.0
    paper = sign * math.log(paper_ratio)
    low, high = sorted(sign * math.log(bound) for bound in (row.ci_low, row.ci_high))
    if low <= paper <= high:
        return "holds" if row.significant else "not resolved here"
    if low > paper:
        return "stronger"
    if row.significant and sign * math.log(row.speedup) < 0:
        return "inverts"
    return "weaker" if row.significant else "weaker (none significant here)"


def _threads(comparison: Comparison) -> str:
    return f"{comparison.num_threads} thread{'s' if comparison.num_threads != 1 else ''}"


@dataclass(frozen=True)
class ProbeTable:
    """One ShuffleNet V2 table timed here: each row's FLOPs, MAC, element-wise traffic, the paper's two ratios,
    this run's, and the trend.

    Ratios are throughputs relative to the table's first row (the comparison's baseline). ``comparison`` is the
    timing read against the paper's half that matches the device (``trend_against_paper``): on a CPU it should
    run at the paper's ARM setting, one thread. ``default_threads``, when given, is the same probes timed at the
    machine's default thread count: a second column, not read against the paper (the paper has no such column).
    """

    guideline: str
    multiplier: int
    gpu_half: bool  # compared with the paper's GPU half (else its ARM half)
    comparison: Comparison
    flops: dict[str, int]
    mac: dict[str, int]  # conv/linear layers, the paper's formula (count_memory_access)
    elementwise: dict[str, int]  # elements the element-wise ops read and write (count_elementwise_access)
    default_threads: Comparison | None = None

    @property
    def half(self) -> str:
        return "GPU" if self.gpu_half else "ARM"

    def paper_ratio(self, name: str) -> float:
        """The paper's throughput ratio for ``name`` in the half this run is compared with."""
        gpu, arm = paper_throughput_ratios(self.guideline, name, self.multiplier)
        return gpu if self.gpu_half else arm

    def trend(self, name: str) -> str:
        return trend_against_paper(self.paper_ratio(name), self.comparison[name])

    def trends(self) -> str:
        """Every row but the first with its trend, in the table's order, e.g. "1:2 holds, 1:6 stronger"."""
        return ", ".join(f"{name} {self.trend(name)}" for name in self.comparison.names[1:])

    def note(self) -> str:
        """The trends against the paper's half at this comparison's thread count, as a verdict-table note: in
        parentheses, each row's name followed by its trend (no "name: outcome" pairs to mistake for verdicts)."""
        at = "" if self.gpu_half else f" at {_threads(self.comparison)}"  # a GPU's timings do not depend on them
        return f" (trend vs the paper's {self.half} ratios{at}: {self.trends()})"

    def rows(self, *, with_counts: bool = True) -> list[list[str]]:
        out = []
        for name in self.comparison.names:
            row, (gpu, arm) = self.comparison[name], paper_throughput_ratios(self.guideline, name, self.multiplier)
            here = (
                f"{row.speedup:.2f}x"
                if row.is_baseline
                else f"{row.speedup:.2f}x [{row.ci_low:.2f}, {row.ci_high:.2f}]"
            )
            cells = [name, f"{gpu:.2f}x", f"{arm:.2f}x", here, row.verdict,
                     "-" if row.is_baseline else self.trend(name)]  # fmt: skip
            if self.default_threads is not None:
                cells.append(self.default_threads[name].verdict)
            if with_counts:
                cells[1:1] = [f"{self.flops[name] / 1e6:.0f}", f"{self.mac[name] / 1e6:.2f}",
                              f"{self.elementwise[name] / 1e6:.2f}"]  # fmt: skip
            out.append(cells)
        return out

    def _header(self, *, with_counts: bool) -> list[str]:
        here = "here" if self.gpu_half else f"here, {_threads(self.comparison)}"
        interval = f"{here} [{CONFIDENCE:.0%} interval]"
        header = ["paper GPU", "paper ARM", interval, "verdict here", f"trend vs paper {self.half}"]
        if self.default_threads is not None:
            header.append(f"here, {_threads(self.default_threads)}")
        return (["MFLOPs", "MAC (M)", "element-wise (M)"] if with_counts else []) + header

    def _repr_markdown_(self) -> str:
        caption = (
            f"{self.guideline}, width x{self.multiplier}: throughput relative to the first row; MAC: conv layers "
            "(the paper's formula); element-wise: elements read and written by element-wise ops"
        )
        return markdown_table(["row", *self._header(with_counts=True)], self.rows(), caption=caption)


@dataclass(frozen=True)
class ProbeTrends:
    """Every timed table's rows (first rows left out) side by side with the paper's ratios: one Markdown table.

    Its columns are the first table's (all tables of one run share the thread counts and the paper's half).
    """

    tables: tuple[ProbeTable, ...]

    def _repr_markdown_(self) -> str:
        if not self.tables:
            return "No probe table was timed."
        body = [
            [f"{t.guideline} x{t.multiplier}", *cells] for t in self.tables for cells in t.rows(with_counts=False)[1:]
        ]
        device = self.tables[0].comparison.device
        header = ["table", "row vs first row", *self.tables[0]._header(with_counts=False)]
        return markdown_table(header, body, caption=f"on {device}")

    def plot(self, ax=None):
        """Each row's median time (at the paper's thread count) against its memory traffic (MAC plus element-wise),
        both relative to its table's first row. Returns the Axes.

        Within a table the FLOPs are equal, so a FLOP model predicts every point at 1x; the x label
        gives the widest FLOP difference of any table.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.8))
        spread = max((max(t.flops.values()) / min(t.flops.values()) - 1 for t in self.tables), default=0.0)
        for t in self.tables:
            cmp_, first = t.comparison, t.comparison.baseline
            traffic = {n: t.mac[n] + t.elementwise[n] for n in cmp_.names}
            xs = [traffic[n] / traffic[first] for n in cmp_.names]
            ys = [cmp_[n].measurement.median / cmp_[first].measurement.median for n in cmp_.names]
            ax.plot(xs, ys, marker="o", linestyle="none", label=f"{t.guideline} x{t.multiplier}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel(f"MAC + element-wise traffic relative to the first row (FLOPs equal within {spread:.1%})")
        cpu = self.tables and not self.tables[0].gpu_half
        ax.set_ylabel("time relative to the first row" + (f" ({_threads(self.tables[0].comparison)})" if cpu else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return ax
