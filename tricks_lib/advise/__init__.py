"""Every applicable trick tried, checked and measured on the reader's own model (notebook 09).

``try_training_tricks(make_model, make_batch, loss_fn)`` and ``try_inference_tricks(make_model, make_input)``
return an ``AdviceReport``: one row per trick (applies here or why not; its check against the baseline;
its interleaved timing with the paired interval), the recommended tricks, their stacked measurement and
the lines to copy (``report.code()``). Modules: ``training``, ``inference``, ``checks`` (loss, gradients,
update and output against the baseline's), ``inputs`` (the arguments' checks), ``report``.
"""

from tricks_lib.advise.inference import INFERENCE_TRICKS, InferenceSwitches, try_inference_tricks
from tricks_lib.advise.report import AdviceReport, TrickRow
from tricks_lib.advise.training import TRAINING_TRICKS, TrainingSwitches, try_training_tricks

__all__ = [
    "INFERENCE_TRICKS",
    "TRAINING_TRICKS",
    "AdviceReport",
    "InferenceSwitches",
    "TrainingSwitches",
    "TrickRow",
    "try_inference_tricks",
    "try_training_tricks",
]
