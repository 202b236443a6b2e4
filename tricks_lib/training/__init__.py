"""Training support: the models the notebooks train, the autocast type per device, the largest batch for a budget.

Modules: ``models`` (``SmallCNN``, ``ResNet``, ``MLP``, ``count_parameters``, ``drop_conv_bias_before_bn``),
``steps`` (``autocast_dtype``), ``batch_size`` (``largest_batch``: the largest batch that
fits a memory budget). The training steps themselves (autocast and GradScaler, channels_last, ``torch.compile``, the
DDP worker and ``no_sync``) are written out in notebook 02, in plain PyTorch.
"""

from tricks_lib.training.batch_size import BatchProbe, BatchSearch, largest_batch
from tricks_lib.training.models import MLP, ResNet, SmallCNN, count_parameters, drop_conv_bias_before_bn
from tricks_lib.training.steps import autocast_dtype

__all__ = [
    "BatchProbe",
    "BatchSearch",
    "MLP",
    "ResNet",
    "SmallCNN",
    "autocast_dtype",
    "count_parameters",
    "drop_conv_bias_before_bn",
    "largest_batch",
]
