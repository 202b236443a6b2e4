"""Training-step tricks: the configurable step, the models it trains, DDP, the largest batch for a budget.

Modules: ``steps`` (``make_train_step``: autocast, GradScaler, channels_last, accumulation, compile,
``set_to_none``; warmup and linear LR scaling; ``evaluate_accuracy``), ``models`` (``SmallCNN``,
``ResNet``, ``MLP``, ``count_parameters``, ``drop_conv_bias_before_bn``), ``ddp`` (``launch_ddp``: a real
multi-process DistributedDataParallel run through torchrun, and its ``DDPResult``), ``ddp_worker`` (what each torchrun
rank runs, as a script: not imported here, so ``python -m`` finds it unloaded), ``batch_size`` (``largest_batch``: the largest batch that fits a memory budget).
"""

from tricks_lib.training.batch_size import BatchProbe, BatchSearch, largest_batch
from tricks_lib.training.ddp import DDPResult, free_port, launch_ddp
from tricks_lib.training.models import MLP, ResNet, SmallCNN, count_parameters, drop_conv_bias_before_bn
from tricks_lib.training.steps import (
    TrainStep,
    TrainStepConfig,
    autocast_dtype,
    evaluate_accuracy,
    linear_scaled_lr,
    linear_warmup,
    make_train_step,
    warmup_factor,
)

__all__ = [
    "BatchProbe",
    "BatchSearch",
    "DDPResult",
    "MLP",
    "ResNet",
    "SmallCNN",
    "TrainStep",
    "TrainStepConfig",
    "autocast_dtype",
    "count_parameters",
    "drop_conv_bias_before_bn",
    "evaluate_accuracy",
    "free_port",
    "largest_batch",
    "launch_ddp",
    "linear_scaled_lr",
    "linear_warmup",
    "make_train_step",
    "warmup_factor",
]
