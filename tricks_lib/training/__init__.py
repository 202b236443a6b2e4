"""Training support: the models the notebooks train, the autocast type per device, the largest batch for a budget.

Modules: ``models`` (``SmallCNN``, ``ResNet``, ``MLP``, ``count_parameters``, ``drop_conv_bias_before_bn``),
``steps`` (``autocast_dtype``), ``batch_size`` (``largest_batch``: the largest batch that
fits a memory budget), ``torchrun`` (``launch_torchrun``: a worker script on local ranks, each rank's results
read back). The training steps themselves (autocast and GradScaler, channels_last, ``torch.compile``, the
DDP worker and ``no_sync``) are written out in notebook 02, in plain PyTorch.
"""

from tricks_lib.training.batch_size import BatchProbe, BatchSearch, largest_batch
from tricks_lib.training.models import MLP, ResNet, SmallCNN, count_parameters, drop_conv_bias_before_bn
from tricks_lib.training.steps import autocast_dtype
from tricks_lib.training.torchrun import RESULT_FOLDER_VARIABLE, TorchrunResult, launch_torchrun

__all__ = [
    "BatchProbe",
    "BatchSearch",
    "MLP",
    "RESULT_FOLDER_VARIABLE",
    "ResNet",
    "SmallCNN",
    "TorchrunResult",
    "autocast_dtype",
    "count_parameters",
    "drop_conv_bias_before_bn",
    "largest_batch",
    "launch_torchrun",
]
