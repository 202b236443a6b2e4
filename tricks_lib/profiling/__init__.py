"""Time analysis: where a step's time goes, read by timers and by ``torch.profiler``.

Modules: ``profiler`` (py-spy sampling, the jittered dataset), ``phases`` (``phase_split``:
data loading vs compute measured two ways), ``phase_shifts`` (``phase_shift``: how a fix moved the split),
``trace`` (a Chrome trace's events and its timeline).
"""

from tricks_lib.profiling.phase_shifts import PhaseShift, phase_shift
from tricks_lib.profiling.phases import WAIT_PHASE, PhaseSplit, phase_split
from tricks_lib.profiling.profiler import (
    JITTER_SCRIPT,
    PixelJitterDataset,
    PySpySample,
    next_batch,
    py_spy_sample,
    read_jitter_forever,
    without_local_paths,
)
from tricks_lib.profiling.trace import DEVICE_CATEGORIES, TraceEvent, label_durations, plot_trace, trace_events

__all__ = [
    "DEVICE_CATEGORIES",
    "JITTER_SCRIPT",
    "PhaseShift",
    "PhaseSplit",
    "PixelJitterDataset",
    "PySpySample",
    "TraceEvent",
    "WAIT_PHASE",
    "label_durations",
    "next_batch",
    "phase_shift",
    "phase_split",
    "plot_trace",
    "py_spy_sample",
    "read_jitter_forever",
    "trace_events",
    "without_local_paths",
]
