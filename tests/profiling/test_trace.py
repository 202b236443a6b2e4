"""tricks_lib.profiling.trace: a profiled loop's labels, the exported Chrome trace, its reading and its timeline."""

import json
import re

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, TensorDataset

from tricks_lib.profiling.trace import TraceEvent, label_durations, plot_trace, trace_events

STEPS = 4


@pytest.fixture(scope="module")
def profiled_loop(tmp_path_factory):
    """A tiny training loop with labelled phases, profiled; its key averages and exported trace."""
    model, loader = nn.Linear(8, 2), DataLoader(TensorDataset(torch.randn(STEPS * 4, 8)), batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for (x,) in loader:
            with record_function("train step"):
                with record_function("forward"):
                    loss = model(x).square().mean()
                with record_function("backward"):
                    loss.backward()
                optimizer.step()
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof.export_chrome_trace(str(path))
    return prof.key_averages(), path


def test_table_contains_the_record_function_labels(profiled_loop):
    averages, _ = profiled_loop
    table = averages.table(sort_by="self_cpu_time_total", row_limit=-1)
    for label in ("train step", "forward", "backward"):
        assert label in table
    assert {e.key: e.count for e in averages}["train step"] == STEPS


def test_exported_trace_is_json_with_events(profiled_loop):
    _, path = profiled_loop
    data = json.loads(path.read_text())
    assert isinstance(data["traceEvents"], list) and data["traceEvents"]
    events = trace_events(path)
    assert events and all(isinstance(e, TraceEvent) for e in events)
    assert all(e.duration_s >= 0 and e.start_s >= 0 for e in events)
    assert [e.start_s for e in events] == sorted(e.start_s for e in events)
    assert min(e.start_s for e in events) == 0.0


def test_label_durations_finds_each_labelled_range(profiled_loop):
    _, path = profiled_loop
    found = label_durations(path, ["train step", "enumerate(DataLoader)", "no such label"])
    assert len(found["train step"]) == STEPS
    assert len(found["enumerate(DataLoader)"]) == STEPS + 1  # the last next() raises StopIteration
    assert found["no such label"] == ()
    steps = [e for e in trace_events(path) if e.name == "train step"]
    forwards = [e for e in trace_events(path) if e.name == "forward"]
    for outer, inner in zip(steps, forwards):  # nesting survives the export
        assert outer.start_s <= inner.start_s and inner.end_s <= outer.end_s + 1e-9


def test_plot_trace_draws_the_trace(profiled_loop):
    from matplotlib.figure import Figure

    _, path = profiled_loop
    fig = plot_trace(path, top=3)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # The 3 names with most total time are coloured, most first (which ones depends on the machine's load).
    totals = {}
    for e in trace_events(path):
        if not e.name.startswith("PyTorch Profiler"):
            name = re.sub(r"#\d+$", "#N", e.name)
            totals[name] = totals.get(name, 0.0) + e.duration_s
    top = sorted(totals, key=totals.get, reverse=True)[:3]
    assert legend == [n if len(n) <= 48 else n[:45] + "..." for n in top]
    every_name = [t.get_text() for t in plot_trace(path, top=len(totals)).axes[0].get_legend().get_texts()]
    assert len(every_name) == len(totals) and "train step" in every_name
    assert len(ax.collections) == sum(1 for e in trace_events(path) if not e.name.startswith("PyTorch Profiler"))


def test_trace_functions_reject_bad_input(tmp_path):
    with pytest.raises(TypeError):
        trace_events(123)
    with pytest.raises(ValueError, match="no trace file"):
        trace_events(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        trace_events(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="traceEvents"):
        trace_events(tmp_path / "other.json")
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="no complete events"):
        plot_trace(tmp_path / "empty.json")
    with pytest.raises(ValueError):
        plot_trace(tmp_path / "empty.json", top=0)
    with pytest.raises(TypeError):
        label_durations(tmp_path / "empty.json", "train step")
    with pytest.raises(ValueError):
        label_durations(tmp_path / "empty.json", [""])


def test_plot_trace_merges_numbered_steps_and_names_lanes(tmp_path):
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main thread"}},
        {"ph": "X", "name": "PyTorch Profiler (0)", "pid": 1, "tid": 9, "ts": 0, "dur": 100},
        {"ph": "X", "name": "ProfilerStep#1", "pid": 1, "tid": 7, "ts": 0, "dur": 40},
        {"ph": "X", "name": "aten::mm", "pid": 1, "tid": 7, "ts": 5, "dur": 30},
        {"ph": "X", "name": "ProfilerStep#2", "pid": 1, "tid": 7, "ts": 50, "dur": 40},
        {"ph": "X", "name": "kernel", "pid": 2, "tid": 3, "ts": 10, "dur": 5},
    ]
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (ax,) = plot_trace(path, top=2).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ProfilerStep#N", "aten::mm"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["main thread", "thread 3"]  # the session lane is left out
    assert len(ax.collections) == 4


def test_label_durations_counts_a_label_once_on_gpu_traces(tmp_path):
    # On CUDA every record_function range appears twice: on the host, and as a gpu_user_annotation.
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "train step", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "train step", "pid": 0, "tid": 7, "ts": 2, "dur": 9},
        {"ph": "X", "cat": "kernel", "name": "train step kernel", "pid": 0, "tid": 7, "ts": 3, "dur": 4},
    ]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (host,) = label_durations(path, ["train step"])["train step"]
    assert host == pytest.approx(10e-6)
    assert len(label_durations(path, ["train step"], host_only=False)["train step"]) == 3
    with pytest.raises(TypeError):
        label_durations(path, ["train step"], host_only=1)
