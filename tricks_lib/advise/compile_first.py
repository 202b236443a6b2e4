"""``torch.compile``'s first call in the reports, timed the way a reader pays it: in fresh processes.

Both reports time the reader's own module compiled in this process (the steady state), and its first call
in two fresh processes, from empty caches and from the warm on-disk cache a rerun finds (``compile_cost``).
A fresh process cannot see the reader's objects, so the model goes there through ``torch.export``; for
training, the model and the loss are exported together (``LossOf``), so the child compiles the same
forward and backward graphs. A model ``torch.export`` cannot export (data-dependent control flow and the
like) is timed in this process instead, and the row says so.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace

import torch
from torch import nn

from tricks_lib.advise.report import TrickRow
from tricks_lib.compiling import CompileCost, calls_to_pay_off, compile_cost
from tricks_lib.inference.compiled import export_for_fresh_processes
from tricks_lib.measurements import Comparison
from tricks_lib.outcome import Outcome

__all__ = ["LossOf", "first_call_note", "fresh_process_compile_cost", "with_break_even"]


class LossOf(nn.Module):
    """``loss_fn(model(*inputs), targets)`` as one module: what ``torch.export`` takes to a fresh process for a
    training step (the last positional argument is the targets)."""

    def __init__(self, model: nn.Module, loss_fn) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs_and_targets: torch.Tensor) -> torch.Tensor:
        *inputs, targets = inputs_and_targets
        return self.loss_fn(self.model(*inputs), targets)


def fresh_process_compile_cost(
    module: nn.Module, example_inputs: tuple, call: str, device: torch.device, progress: bool
) -> tuple[CompileCost | None, str]:
    """The first ``call`` of ``torch.compile(module)`` in fresh processes, cold and warm: (cost, "").

    ``call`` is an expression over ``compiled`` and ``inputs``, e.g. ``"compiled(*inputs).backward()"``.
    Returns (None, the reason's first line) where ``torch.export`` cannot export ``module``; a fresh
    process that fails raises (``RuntimeError`` from ``compile_cost``).
    """
    folder = tempfile.mkdtemp(prefix="tricks-advise-")
    try:
        try:
            setup = export_for_fresh_processes(module, example_inputs, folder)
        except Exception as err:
            return None, (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        cost = compile_cost(
            setup + "compiled = torch.compile(model)\n", call, device=device, progress=progress, here=False
        )
        return cost, ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def first_call_note(cost: CompileCost | None, first_here: float | None, unit: str, reason: str) -> str:
    """The row's note on the first call: from the fresh processes, or from this process and why."""
    if cost is not None:
        return (
            f"first {unit} in a fresh process {cost.cold_seconds:.1f} s (empty caches), "
            f"{cost.warm_seconds:.1f} s (warm cache)"
        )
    return f"first {unit} {first_here:.1f} s in this process, cold cache (torch.export could not export it: {reason})"


def with_break_even(
    row: TrickRow, comparison: Comparison, cost: CompileCost | None, first_here: float | None, unit: str
) -> TrickRow:
    """``row`` with the calls after which the compile pays for itself added to its note (never, unless the
    compiled call was significantly faster): cold and warm from ``cost``, else from this process's first call."""
    if cost is not None:
        paid = cost.break_even(comparison, "torch.compile", "baseline").text(unit)
    else:
        eager, compiled = comparison["baseline"].measurement.median, comparison["torch.compile"].measurement.median
        calls = calls_to_pay_off(first_here, eager, compiled) if first_here else None
        faster = comparison.versus("torch.compile", "baseline").outcome is Outcome.FASTER
        paid = f"pays off after about {calls:,.0f} {unit}" if faster and calls is not None else "never pays off here"
    return replace(row, note=f"{row.note}; {paid}")
