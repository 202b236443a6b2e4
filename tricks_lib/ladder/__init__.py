"""The capstone's training ladder: airbench94's network and recipe, one rung of tricks at a time.

Modules: ``airbench`` (the network, its whitening init, the published records), ``config`` (``LadderConfig``:
the rungs are its fields), ``images`` (the photos or CIFAR-10 as tensors, and batch augmentation),
``run`` (``run_ladder``, ``train_to_target``, ``run_to_target``: the measuring around the caller's training
step, which the capstone notebook writes out), ``results`` (each rung's runs over seeds and its verdict).
"""

from tricks_lib.ladder.airbench import (
    AIRBENCH94_WIDTHS,
    PUBLISHED_RECORDS,
    TRAINING_FLOPS_PER_FORWARD,
    Airbench94,
    PublishedRecord,
    RecordComparison,
    init_whitening,
    make_airbench94,
)
from tricks_lib.ladder.config import LadderConfig, TargetTrace, TrainingRun
from tricks_lib.ladder.images import HostAugmentedDataset, ImageData, augment_batch, cifar10_data, photo_data
from tricks_lib.ladder.results import CompilePayback, EpochsChange, Ladder, LadderReading, Rung, RungResult
from tricks_lib.ladder.run import BuildStep, run_ladder, run_to_target, train_to_target, unsupported_reason

__all__ = [
    "AIRBENCH94_WIDTHS",
    "Airbench94",
    "BuildStep",
    "CompilePayback",
    "EpochsChange",
    "HostAugmentedDataset",
    "ImageData",
    "Ladder",
    "LadderConfig",
    "LadderReading",
    "PUBLISHED_RECORDS",
    "PublishedRecord",
    "RecordComparison",
    "Rung",
    "RungResult",
    "TRAINING_FLOPS_PER_FORWARD",
    "TargetTrace",
    "TrainingRun",
    "augment_batch",
    "cifar10_data",
    "init_whitening",
    "make_airbench94",
    "photo_data",
    "run_ladder",
    "run_to_target",
    "train_to_target",
    "unsupported_reason",
]
