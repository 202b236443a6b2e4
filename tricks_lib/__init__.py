"""tricks_lib: the measuring core behind the PyTorch Tricks notebooks.

The package root is the core a reader reuses in their own code: timing and comparison (``timing``,
``comparing``, ``timed_blocks``), result types and the statistics behind "significant"
(``measurements``, ``outcome``, ``stats``), memory (``memory``), first-call and compile costs
(``compiling``), the environment stamp (``env``), formatting, plotting and progress bars. The main
command and what it writes live in ``tricks_lib.report``; each topic's support code lives in its own
subpackage (``data``, ``training``, ``design``, ``inference``, ``profiling``, ``repro``, ``ladder``).

Import what you need; importing loads the core only and changes no seed, flag or plot style.

    from tricks_lib import compare, measure_memory, describe
"""

from tricks_lib.comparing import Budget, compare
from tricks_lib.compiling import CompileCost, compile_cost, fresh_compile_cache
from tricks_lib.env import EnvInfo, describe, is_colab, pick_device, quick_mode, size_for_mode
from tricks_lib.formatting import format_bytes, format_seconds, markdown_table
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.memory import MemoryReport, StateBytes, measure_memory, model_state_bytes
from tricks_lib.outcome import Outcome
from tricks_lib.plot import metric_vs_size, speedup_bars
from tricks_lib.progress import progress_bar
from tricks_lib.timing import measure, time_first_call

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "Comparison",
    "ComparisonRow",
    "CompileCost",
    "EnvInfo",
    "Measurement",
    "MemoryReport",
    "Outcome",
    "StateBytes",
    "compare",
    "compile_cost",
    "describe",
    "format_bytes",
    "format_seconds",
    "fresh_compile_cache",
    "is_colab",
    "markdown_table",
    "measure",
    "measure_memory",
    "metric_vs_size",
    "model_state_bytes",
    "pick_device",
    "progress_bar",
    "quick_mode",
    "size_for_mode",
    "speedup_bars",
    "time_first_call",
]
