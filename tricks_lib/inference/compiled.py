"""Models handed to fresh processes: ``export_for_fresh_processes`` saves a model and its inputs so that the
fresh processes of ``tricks_lib.compiling.compile_cost`` and ``compare_environments`` run exactly the same
weights (notebook 05 writes Inductor's freezing switch out itself).
"""

from __future__ import annotations

import os

import torch

__all__ = ["export_for_fresh_processes"]


def export_for_fresh_processes(model: torch.nn.Module, example_inputs: tuple, folder: str | os.PathLike) -> str:
    """Save ``model`` (``torch.export``) and its inputs under ``folder``; return setup source that loads them.

    Fresh processes (``compile_cost``, ``compare_environments``) cannot see the caller's objects; this
    gives them the exact same weights and inputs. The returned source defines ``model`` (the exported
    program's module) and ``inputs`` (the tuple); append the ``torch.compile`` line and time e.g.
    ``"compiled(*inputs)"``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``example_inputs`` not a tuple.
        Whatever ``torch.export.export`` raises for a model it cannot export.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple of inputs, got {type(example_inputs).__name__}")
    os.makedirs(folder, exist_ok=True)
    program = os.path.join(folder, f"{type(model).__name__}-{id(model):x}.pt2")
    inputs = program.removesuffix(".pt2") + "-inputs.pt"
    torch.export.save(torch.export.export(model, example_inputs), program)
    torch.save(example_inputs, inputs)
    return f"import torch\nmodel = torch.export.load({program!r}).module()\ninputs = torch.load({inputs!r}, weights_only=True)\n"
