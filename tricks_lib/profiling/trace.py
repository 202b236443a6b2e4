"""Reading and drawing the Chrome/Perfetto trace that ``torch.profiler`` exports.

``prof.export_chrome_trace(path)`` writes JSON in the Trace Event Format: a dict whose
``"traceEvents"`` list holds complete events (``"ph": "X"``, a start ``ts`` and a duration ``dur``,
both in microseconds, on a process ``pid`` and thread ``tid``) and metadata (``"ph": "M"``, e.g. a
thread's name). Three functions read it:

- ``trace_events(path)``: the complete events, as ``TraceEvent`` values sorted by start time.
- ``label_durations(path, prefixes)``: the duration of every event whose name starts with a prefix,
  in order (e.g. the DataLoader's ``enumerate(DataLoader)#...__next__`` ranges, or a
  ``record_function`` label).
- ``plot_trace(path, top=8)``: a timeline, one lane per thread, nested ranges stacked, the ``top``
  names with the most total time in colour. Open the same file in https://ui.perfetto.dev to explore.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tricks_lib._validate import check_flag, check_positive

__all__ = ["DEVICE_CATEGORIES", "TraceEvent", "label_durations", "plot_trace", "trace_events"]

# Categories of events that run on a device, in torch.profiler's traces; everything else is host-side.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
_MAX_DEPTH = 8  # nesting levels drawn per lane; deeper ranges are drawn at this level
_NAME_CHARS = 48  # legend entries are cut to this many characters


@dataclass(frozen=True)
class TraceEvent:
    """One complete event of a trace: its name, category, lane and time span (seconds from trace start)."""

    name: str
    category: str
    pid: int | str
    tid: int | str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or pathlib.Path naming a trace file, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no trace file at {path.name!r}: export one with prof.export_chrome_trace(path) first")
    return path


def _load(path: Path) -> tuple[list[dict], dict[tuple, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path.name} is not JSON ({err}): is it a Chrome trace from export_chrome_trace?") from err
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise ValueError(f"{path.name} has no 'traceEvents' list: not a Chrome/Perfetto trace")
    names = {
        (e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name"))
        for e in raw
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    return raw, names


def trace_events(path: str | Path) -> list[TraceEvent]:
    """The complete (``"ph": "X"``) events of an exported trace, sorted by start; times in seconds.

    Raises:
        TypeError: ``path`` is not a str or Path.
        ValueError: the file is missing, not JSON, or has no ``traceEvents`` list.
    """
    raw, _ = _load(_check_path(path))
    complete = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]
    if not complete:
        return []
    origin = min(float(e["ts"]) for e in complete)
    events = [
        TraceEvent(
            name=str(e.get("name", "")),
            category=str(e.get("cat", "")),
            pid=e.get("pid", 0),
            tid=e.get("tid", 0),
            start_s=(float(e["ts"]) - origin) * 1e-6,
            duration_s=float(e["dur"]) * 1e-6,
        )
        for e in complete
    ]
    return sorted(events, key=lambda ev: (ev.start_s, -ev.duration_s))


def label_durations(
    path: str | Path, prefixes: Sequence[str], *, host_only: bool = True
) -> dict[str, tuple[float, ...]]:
    """Seconds of each event whose name starts with one of ``prefixes``, in start order, per prefix.

    Example: ``label_durations(path, ["enumerate(DataLoader)", "train step"])`` gives each wait for
    a batch and each labelled step; sum them (dropping warm-up steps) for the profiler's split.

    Args:
        path: an exported trace.
        prefixes: the name prefixes to collect.
        host_only: leave out device-side events (GPU kernels, copies, and the GPU copy of each
            ``record_function`` range, category ``gpu_user_annotation``), so a label counts once.

    Raises:
        TypeError / ValueError: ``prefixes`` is not a non-empty sequence of non-empty strings; a bad trace file.
    """
    if isinstance(prefixes, str) or not isinstance(prefixes, Sequence):
        raise TypeError(f"prefixes must be a list of name prefixes, got {type(prefixes).__name__}")
    if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(f"prefixes must be non-empty strings, e.g. ['train step'], got {list(prefixes)!r}")
    check_flag(host_only, "host_only")
    events = [e for e in trace_events(path) if not (host_only and e.category in DEVICE_CATEGORIES)]
    return {p: tuple(e.duration_s for e in events if e.name.startswith(p)) for p in prefixes}


def _depths(events: list[TraceEvent]) -> list[int]:
    """Nesting level of each event in one lane (events sorted by start, longer first on ties)."""
    open_ends: list[float] = []
    depths = []
    for e in events:
        while open_ends and open_ends[-1] <= e.start_s:
            open_ends.pop()
        depths.append(min(len(open_ends), _MAX_DEPTH - 1))
        open_ends.append(e.end_s)
    return depths


def plot_trace(path: str | Path, *, top: int = 8, title: str | None = None):
    """A timeline of an exported trace: one lane per thread, nested ranges stacked downwards.

    The ``top`` event names with the most total time get a colour and a legend entry; every other
    event is grey; numbered copies of a name ("ProfilerStep#3", "ProfilerStep#4") share a colour.
    The profiler's own session range ("PyTorch Profiler (0)") is left out. The x axis is
    milliseconds from the trace's first event.

    Args:
        path: a trace written by ``torch.profiler``'s ``export_chrome_trace`` (or any Chrome trace JSON).
        top: how many names to colour.
        title: the figure's title (default: the number of events drawn).

    Returns:
        The ``matplotlib.figure.Figure`` (made without pyplot: nothing is shown or printed; Jupyter
        renders the returned figure).

    Raises:
        TypeError / ValueError: a bad ``path`` or ``top``; a file that is not a trace; a trace without events.
    """
    check_positive(top, "top", allow_none=False, integer=True)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string, got {type(title).__name__}")
    # The profiler's own session range spans the whole trace in a lane of its own: nothing to read there.
    events = [e for e in trace_events(path) if not e.name.startswith("PyTorch Profiler")]
    if not events:
        raise ValueError("the trace has no complete events to draw: was anything run inside the profiler?")
    _, thread_names = _load(Path(path))
    # "ProfilerStep#3" and "ProfilerStep#4" are one kind of range: one colour for all numbered copies.
    kinds = [re.sub(r"#\d+$", "#N", e.name) for e in events]
    totals: dict[str, float] = {}
    for e, kind in zip(events, kinds):
        totals[kind] = totals.get(kind, 0.0) + e.duration_s
    ranked = sorted(totals, key=totals.get, reverse=True)[:top]

    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    palette = colormaps["tab10" if top <= 10 else "tab20"]
    colour = {name: palette(i % palette.N) for i, name in enumerate(ranked)}
    lanes: dict[tuple, list[TraceEvent]] = {}
    for e in events:
        lanes.setdefault((e.pid, e.tid), []).append(e)
    fig = Figure(figsize=(9, max(2.5, 1.0 + 1.1 * len(lanes))), layout="constrained")
    ax = fig.add_subplot()
    labels = []
    for lane, (key, lane_events) in enumerate(lanes.items()):
        depths = _depths(lane_events)
        row_height = 0.9 / max(1, max(depths) + 1)
        for e, depth in zip(lane_events, depths):
            ax.broken_barh(
                [(e.start_s * 1e3, max(e.duration_s * 1e3, 1e-6))],
                (lane + depth * row_height, row_height * 0.95),
                facecolors=colour.get(re.sub(r"#\d+$", "#N", e.name), "0.8"),
                linewidth=0,
            )
        labels.append(thread_names.get(key) or f"thread {key[1]}")
    ax.set_yticks([lane + 0.45 for lane in range(len(lanes))], labels)
    ax.set_ylim(len(lanes), 0)  # first lane on top; nested ranges hang below their parent
    ax.set_xlabel("ms from the first event")
    ax.set_title(title or f"{len(events)} events, {len(lanes)} lane(s); colour: the {len(ranked)} names with most time")
    handles = [
        Patch(color=colour[n], label=n if len(n) <= _NAME_CHARS else n[: _NAME_CHARS - 3] + "...") for n in ranked
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
