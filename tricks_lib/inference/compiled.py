"""Compiling for inference: Inductor's freezing switched on for real, its generated code, and models
handed to fresh processes.

``compile_frozen`` compiles a model for inference with freezing on (``options={"freezing": True}``
alone does not freeze in torch 2.14); ``compiled_source`` and ``frozen_parameters`` read what Inductor
generated; ``export_for_fresh_processes`` saves a model and its inputs so that the fresh processes of
``tricks_lib.compiling.compile_cost`` and ``compare_environments`` run exactly the same weights.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch

__all__ = ["compile_frozen", "compiled_source", "export_for_fresh_processes", "frozen_parameters"]


def _inductor_config():
    """``torch._inductor.config``, imported on first use (importing Inductor costs about 1.5 s)."""
    import torch._inductor.config

    return torch._inductor.config


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
    return f"import torch\nmodel = torch.export.load({program!r}).module()\ninputs = torch.load({inputs!r})\n"


def compile_frozen(
    model: torch.nn.Module, example_inputs: tuple, *, max_autotune: bool = False
) -> Callable[..., object]:
    """``torch.compile`` for inference with Inductor's freezing really on, compiled by one first call.

    ``torch.compile(model, options={"freezing": True})`` does not freeze in torch 2.14: Dynamo decides
    whether the parameters become constants from the *global* ``torch._inductor.config.freezing`` when
    it traces, and ``options`` only reach Inductor after that (pytorch/pytorch#139272 describes the
    Dynamo side), so the graph keeps its weights as inputs and nothing is folded or pre-packed. This
    sets the global flag for the first call only (``config.patch``), so the graph is traced and
    compiled frozen there; later calls reuse it. Call it inside the grad mode of the later calls
    (``torch.no_grad()`` or ``torch.inference_mode()``: Dynamo guards on it, and a call in the other
    one recompiles, without freezing).

    Args:
        model: the module (or function) to compile, in eval mode; its weights must not change afterwards.
        example_inputs: the positional inputs of the first call (a tuple), with the shapes of later calls.
        max_autotune: also benchmark GEMM choices (Inductor's ``max_autotune``; on a CPU the C++ GEMM
            templates, which need the frozen, constant weights, against ATen's kernels).

    Returns:
        The compiled callable, already called once. Call it in the same grad mode with inputs of the
        same shapes: a call that fails Dynamo's guards recompiles without freezing.

    Raises:
        TypeError: ``model`` is not callable, ``example_inputs`` not a tuple or ``max_autotune`` not a bool.
        ValueError: ``model`` is an ``nn.Module`` in training mode (freezing is for inference); an
            ``fx.GraphModule`` is not checked (an exported graph's flag says nothing about its ops).
        RuntimeError: called with grad mode on (Inductor freezes only graphs traced without autograd).
    """
    if not callable(model):
        raise TypeError(f"model must be an nn.Module or a function, got {type(model).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of the first call's inputs, got {type(example_inputs).__name__}"
        )
    if not isinstance(max_autotune, bool):
        raise TypeError(f"max_autotune must be True or False, got {max_autotune!r}")
    # An exported GraphModule (torch.export, PT2E) keeps training=True; its ops, not the flag, decide its mode.
    if isinstance(model, torch.nn.Module) and not isinstance(model, torch.fx.GraphModule) and model.training:
        raise ValueError("compile_frozen is for inference: call model.eval() first")
    if torch.is_grad_enabled():
        raise RuntimeError("call compile_frozen inside torch.no_grad() or torch.inference_mode(), as its later calls")
    compiled = torch.compile(model, options={"max_autotune": True} if max_autotune else None)
    with _inductor_config().patch(freezing=True):
        compiled(*example_inputs)
    return compiled


def compiled_source(fn: Callable[[], object]) -> tuple[object, str]:
    """Run ``fn()`` and return (its result, the Python/C++ source Inductor generated for graphs compiled meanwhile).

    Built on ``torch._inductor.utils.run_and_get_code``; graphs compiled before ``fn`` ran (or loaded
    from the on-disk cache without code generation) may leave the source empty.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a zero-argument callable, got {type(fn).__name__}")
    from torch._inductor.utils import run_and_get_code

    result, sources = run_and_get_code(fn)
    return result, "\n".join(sources)


def frozen_parameters(source: str) -> int:
    """How many distinct frozen constants (``_frozen_paramN``) Inductor's generated ``source`` uses.

    Zero means the weights stayed graph inputs: nothing was folded or pre-packed.

    Raises:
        TypeError: ``source`` is not a string.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be generated code (a str, from compiled_source), got {type(source).__name__}")
    return len(set(re.findall(r"_frozen_param\d+", source)))
