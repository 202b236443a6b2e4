"""tricks_lib: the measurement core behind the PyTorch Tricks notebooks.

Import what you need; importing changes no seed, flag or plot style.

    from tricks_lib import compare, measure_memory, describe
"""

from tricks_lib.bench import Comparison, ComparisonRow, Measurement, compare, format_seconds, measure, time_first_call
from tricks_lib.env import EnvInfo, describe, is_colab, pick_device, quick_mode, size_for_mode
from tricks_lib.memory import MemoryReport, StateBytes, format_bytes, measure_memory, model_state_bytes
from tricks_lib.plot import metric_vs_size, speedup_bars
from tricks_lib.results import Record, load_records, record

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "ComparisonRow",
    "EnvInfo",
    "Measurement",
    "MemoryReport",
    "Record",
    "StateBytes",
    "compare",
    "describe",
    "format_bytes",
    "format_seconds",
    "is_colab",
    "load_records",
    "measure",
    "measure_memory",
    "metric_vs_size",
    "model_state_bytes",
    "pick_device",
    "quick_mode",
    "record",
    "size_for_mode",
    "speedup_bars",
    "time_first_call",
]
