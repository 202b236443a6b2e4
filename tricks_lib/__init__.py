"""tricks_lib: the measurement core behind the PyTorch Tricks notebooks.

Import what you need; importing changes no seed, flag or plot style.

    from tricks_lib import compare, measure_memory, describe
"""

from tricks_lib.batch_size import BatchProbe, BatchSearch, largest_batch
from tricks_lib.bench import Comparison, ComparisonRow, Measurement, compare, format_seconds, measure, time_first_call
from tricks_lib.compiling import CompileCost, compile_cost, fresh_compile_cache
from tricks_lib.ddp import DDPResult, launch_ddp
from tricks_lib.env import EnvInfo, describe, is_colab, pick_device, quick_mode, size_for_mode
from tricks_lib.memory import MemoryReport, StateBytes, format_bytes, measure_memory, model_state_bytes
from tricks_lib.models import MLP, ResNet, SmallCNN, count_parameters, drop_conv_bias_before_bn
from tricks_lib.plot import metric_vs_size, speedup_bars
from tricks_lib.repro import (
    DeterminismFlags,
    RngState,
    capture_rng_state,
    determinism_flags,
    deterministic,
    fingerprint,
    make_generator,
    restore_rng_state,
    seed_everything,
    seed_worker,
)
from tricks_lib.results import Record, load_records, record
from tricks_lib.training import (
    TrainStep,
    TrainStepConfig,
    evaluate_accuracy,
    linear_scaled_lr,
    linear_warmup,
    make_train_step,
    warmup_factor,
)

__version__ = "0.1.0"

__all__ = [
    "BatchProbe",
    "BatchSearch",
    "Comparison",
    "ComparisonRow",
    "CompileCost",
    "DDPResult",
    "DeterminismFlags",
    "EnvInfo",
    "MLP",
    "Measurement",
    "MemoryReport",
    "Record",
    "ResNet",
    "RngState",
    "SmallCNN",
    "StateBytes",
    "TrainStep",
    "TrainStepConfig",
    "capture_rng_state",
    "compare",
    "compile_cost",
    "count_parameters",
    "describe",
    "determinism_flags",
    "deterministic",
    "drop_conv_bias_before_bn",
    "evaluate_accuracy",
    "fingerprint",
    "format_bytes",
    "format_seconds",
    "fresh_compile_cache",
    "is_colab",
    "largest_batch",
    "launch_ddp",
    "linear_scaled_lr",
    "linear_warmup",
    "load_records",
    "make_generator",
    "make_train_step",
    "measure",
    "measure_memory",
    "metric_vs_size",
    "model_state_bytes",
    "pick_device",
    "quick_mode",
    "record",
    "restore_rng_state",
    "seed_everything",
    "seed_worker",
    "size_for_mode",
    "speedup_bars",
    "time_first_call",
    "warmup_factor",
]
