"""``python -m tricks_lib advise MODULE``: the reader's factories read from a module of their own.

MODULE is an importable name (``mypackage.bench``) or a path to a ``.py`` file. For training it must
define ``make_model``, ``make_batch`` and ``loss_fn`` (and may define ``make_optimizer``); with
``--inference``, ``make_model`` and ``make_input``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tricks_lib.advise.inference import try_inference_tricks
from tricks_lib.advise.report import AdviceReport
from tricks_lib.advise.training import try_training_tricks

__all__ = ["advise_module", "load_module"]


def load_module(spec: str) -> ModuleType:
    """Import ``spec``: a dotted module name, or the path of a ``.py`` file.

    Raises:
        ValueError: nothing by that name or path (the message says which was tried).
    """
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"{spec}: no such file")
        name = f"_tricks_advise_{path.stem}"  # its own name: never an earlier module of the same stem
        loaded = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module  # dataclasses and pickling look a module up by name
        try:
            loaded.loader.exec_module(module)
        except Exception as err:
            raise ValueError(f"{spec} raised {type(err).__name__} while it was imported: {err}") from None
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name and spec.startswith(err.name):
            raise ValueError(f"cannot import {spec!r}: pass a module name on the path or a .py file") from None
        raise ValueError(f"{spec} needs {err.name!r}, which is not installed ({err})") from None
    except Exception as err:
        raise ValueError(f"{spec} raised {type(err).__name__} while it was imported: {err}") from None


def advise_module(spec: str, *, inference: bool, device: str | None, budget_s: float, tricks=None) -> AdviceReport:
    module = load_module(spec)
    wanted = ("make_model", "make_input") if inference else ("make_model", "make_batch", "loss_fn")
    missing = [name for name in wanted if not hasattr(module, name)]
    if missing:
        raise ValueError(f"{spec} does not define {', '.join(missing)} (it needs {', '.join(wanted)})")
    if inference:
        return try_inference_tricks(
            module.make_model, module.make_input, device=device, budget_s=budget_s, tricks=tricks
        )
    return try_training_tricks(
        module.make_model,
        module.make_batch,
        module.loss_fn,
        make_optimizer=getattr(module, "make_optimizer", None),
        device=device,
        budget_s=budget_s,
        tricks=tricks,
    )
