"""The few plots the notebooks share. Each returns its matplotlib Axes and sets no global style."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["metric_vs_size", "speedup_bars"]


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(6.4, 3.2))
    return ax


def speedup_bars(comparison, ax=None):
    """Horizontal bars of each variant's median time, whiskers spanning its IQR, verdicts as labels.

    ``comparison`` is a ``tricks_lib.measurements.Comparison`` (read by its attributes: this module
    imports no result type, so the result types can offer ``.plot()``).
    """
    # Read by shape, not by type: this module imports no result type, so the results can import it.
    if not all(hasattr(comparison, a) for a in ("rows", "baseline", "rounds")):
        raise TypeError(f"speedup_bars needs a Comparison from tricks_lib.compare, got {type(comparison).__name__}")
    ax = _axes(ax)
    rows = list(comparison.rows)
    medians = [r.measurement.median for r in rows]
    scale, unit = _time_scale(max(medians))
    import numpy as np

    lows = []
    highs = []
    for r in rows:
        t = np.asarray(r.measurement.times)
        lows.append(r.measurement.median - np.percentile(t, 25))
        highs.append(np.percentile(t, 75) - r.measurement.median)
    y = list(range(len(rows)))
    by_outcome = {"baseline": "0.6", "faster": "tab:green", "slower": "tab:red"}
    colors = [by_outcome.get(r.outcome.value, "tab:gray") for r in rows]
    ax.barh(
        y,
        [m / scale for m in medians],
        xerr=[[v / scale for v in lows], [v / scale for v in highs]],
        color=colors,
        capsize=3,
    )
    ax.set_yticks(y, [r.name for r in rows])
    ax.invert_yaxis()
    for yi, r, m, high in zip(y, rows, medians, highs):
        # Past the whisker's end, so that the label never runs through the spread it qualifies.
        ax.annotate(
            f" {r.verdict}",
            ((m + high) / scale, yi),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_xlabel(f"median time per call ({unit}); whiskers: IQR")
    ax.set_title(comparison.label, fontsize=10)
    ax.margins(x=0.25)
    return ax


def _time_scale(seconds: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return scale, unit
    return 1e-9, "ns"


def metric_vs_size(
    sizes: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    ax=None,
    logx: bool = False,
    logy: bool = False,
):
    """One line per series of a metric against a size (batch size, depth, workers...).

    Raises:
        ValueError: a series' length differs from ``sizes`` or there is no series.
    """
    if not series:
        raise ValueError("series is empty: pass at least one name -> values")
    for name, values in series.items():
        if len(values) != len(sizes):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(sizes)} sizes")
    ax = _axes(ax)
    drawn: list[list[float]] = []
    for name, values in series.items():
        same_as = next((i for i, v in enumerate(drawn) if v == list(values)), None)
        if same_as is None:
            ax.plot(list(sizes), list(values), marker="o", label=name)
        else:
            # Identical values would hide this line under the earlier one: draw it dashed with hollow
            # markers on top, and say so in the legend.
            earlier = list(series)[same_as]
            ax.plot(
                list(sizes),
                list(values),
                marker="o",
                markerfacecolor="none",
                markersize=9,
                linestyle="--",
                label=f"{name} (same values as {earlier})",
            )
        drawn.append(list(values))
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax
