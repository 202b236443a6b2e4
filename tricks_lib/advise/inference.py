"""``try_inference_tricks``: every applicable inference trick tried on the reader's own forward pass.

The baseline is the forward pass as first written: ``model.eval()`` and ``model(x)``, autograd still
recording. Each trick is one switch (``InferenceSwitches``); its outputs are checked against the
baseline's (a lossless trick within ``exact_tolerance``, relative; a lossy one, 16-bit or int8, within
``lossy_tolerance``, with the argmax agreement of (N, classes) outputs reported), then every trick that
passed is timed in one interleaved comparison, and the recommended ones are stacked.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from tricks_lib._validate import check_flag
from tricks_lib.advise.checks import relative_error
from tricks_lib.advise.compile_first import first_call_note, fresh_process_compile_cost, with_break_even
from tricks_lib.advise.inputs import (
    as_tensors,
    bf16_reason,
    channels_last_reason,
    check_budget,
    check_factory,
    check_same_weights,
    check_tolerances,
    check_tricks,
    move,
)
from tricks_lib.advise.report import AdviceReport, TrickRow
from tricks_lib.advise.timing import CALLS_PER_VARIANT, raised_row, spent_row, time_passing, time_stacked
from tricks_lib.compiling import fresh_compile_cache
from tricks_lib.env import describe, pick_device
from tricks_lib.timing import time_first_call

__all__ = ["INFERENCE_TRICKS", "InferenceSwitches", "try_inference_tricks"]

INFERENCE_TRICKS = (
    "no_grad",
    "inference_mode",
    "bf16 autocast",
    "fp16 autocast",
    "dynamic int8 (Linear)",
    "channels_last",
    "torch.compile",
    "fewer threads",
)
LOSSY = {"bf16 autocast", "fp16 autocast", "dynamic int8 (Linear)"}
LINES = {
    "no_grad": "with torch.no_grad():\n    out = model(x)",
    "inference_mode": "with torch.inference_mode():\n    out = model(x)",
    "bf16 autocast": "with torch.autocast(device.type, dtype=torch.bfloat16):\n    out = model(x)",
    "fp16 autocast": "with torch.autocast(device.type, dtype=torch.float16):\n    out = model(x)",
    "dynamic int8 (Linear)": "model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)",
    "channels_last": "model = model.to(memory_format=torch.channels_last)\n"
    "x = x.contiguous(memory_format=torch.channels_last)",
    "torch.compile": "model = torch.compile(model)  # on a CPU under no_grad also: torch._inductor.config.freezing = True",
    "fewer threads": "torch.set_num_threads({threads})",
}


@dataclass(frozen=True)
class InferenceSwitches:
    grad: str = "enabled"  # "enabled", "no_grad" or "inference_mode"
    autocast: torch.dtype | None = None
    int8: bool = False
    channels_last: bool = False
    compile: bool = False
    threads: int | None = None  # torch's intra-op threads during the call (None: as set)


def fewer_threads() -> int:
    """The thread count the "fewer threads" trick tries: half of torch's intra-op threads (at least one)."""
    return max(1, torch.get_num_threads() // 2)


SWITCH_OF = {
    "no_grad": InferenceSwitches(grad="no_grad"),
    "inference_mode": InferenceSwitches(grad="inference_mode"),
    "bf16 autocast": InferenceSwitches(autocast=torch.bfloat16),
    "fp16 autocast": InferenceSwitches(autocast=torch.float16),
    "dynamic int8 (Linear)": InferenceSwitches(int8=True),
    "channels_last": InferenceSwitches(channels_last=True),
    "torch.compile": InferenceSwitches(compile=True),
}


def _switches_of(name: str) -> InferenceSwitches:
    return InferenceSwitches(threads=fewer_threads()) if name == "fewer threads" else SWITCH_OF[name]


def _combine(switches: Sequence[InferenceSwitches]) -> InferenceSwitches:
    out = InferenceSwitches()
    for s in switches:
        grad = s.grad if s.grad != "enabled" and out.grad != "inference_mode" else out.grad
        out = InferenceSwitches(
            grad=grad,
            autocast=s.autocast or out.autocast,
            int8=out.int8 or s.int8,
            channels_last=out.channels_last or s.channels_last,
            compile=out.compile or s.compile,
            threads=s.threads or out.threads,
        )
    return out


def _build(make_model, inputs, device: torch.device, s: InferenceSwitches) -> Callable[[], torch.Tensor]:
    """The forward pass with switches ``s``: returns ``call()`` giving the first output tensor."""
    model = make_model().to(device).eval()
    if s.int8:
        with warnings.catch_warnings():  # torch.ao's eager quantization is deprecated in favour of torchao
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    if s.channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
    forward = torch.compile(model) if s.compile else model
    # Freezing (CPU, no autograd): Inductor reads its config when it compiles, at the first call, so that call
    # runs inside the patch; later calls reuse the frozen graph.
    freeze = s.compile and device.type == "cpu" and s.grad != "enabled"
    grad = {"enabled": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[s.grad]
    compiled_yet = [not freeze]

    def call() -> torch.Tensor:
        if s.threads is None:
            return forward_once()
        # Set for this call only, so that the variants timed in the same interleaved rounds keep their own count
        # (switching costs about 0.2 us).
        threads = torch.get_num_threads()
        torch.set_num_threads(s.threads)
        try:
            return forward_once()
        finally:
            torch.set_num_threads(threads)

    def forward_once() -> torch.Tensor:
        config = contextlib.nullcontext()
        if not compiled_yet[0]:
            import torch._inductor.config as inductor_config

            config, compiled_yet[0] = inductor_config.patch(freezing=True), True
        with config, grad():
            with torch.autocast(device.type, dtype=s.autocast or torch.bfloat16, enabled=s.autocast is not None):
                out = forward(*inputs)
        return _flat_output(out)

    return call


def _compiled_call(make_model, inputs, device: torch.device, progress: bool):
    """``torch.compile`` of the model, its first call timed in fresh processes (cold and warm caches) where
    ``torch.export`` can export it: (the compiled call here, the ``CompileCost`` or None, the row's note)."""
    cost, why = fresh_process_compile_cost(
        make_model().to(device).eval(), tuple(inputs), "compiled(*inputs)", device, progress
    )
    # The timed variant is your own module compiled here (the exported module is for the fresh processes only: it
    # checks its inputs on every call, which would be timed too).
    # Its first call here is the row's cost only where the fresh processes could not run: only then from empty caches.
    call = _build(make_model, inputs, device, InferenceSwitches(compile=True))
    with fresh_compile_cache() if cost is None else contextlib.nullcontext():
        first = time_first_call(call, device=device)
    return call, cost, first, first_call_note(cost, first, "call", why)


def _flat_output(out: object) -> torch.Tensor:
    """Every tensor of a model's output (a tensor, tuple, list, dict, dataclass-like output), as one flat fp32 vector."""
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not leaves:
        raise TypeError(f"the model's output holds no tensor (got {type(out).__name__})")
    if len(leaves) == 1:
        return leaves[0]
    return torch.cat([t.detach().float().flatten() for t in leaves])


def _not_applicable(name: str, model: nn.Module, inputs, device: torch.device, env) -> str | None:
    cuda = device.type == "cuda"
    if name == "bf16 autocast":
        return bf16_reason(device, env.cpu_bf16_native, "use fp16")
    elif name == "fp16 autocast" and not cuda:
        return "needs a CUDA GPU (CPU fp16 kernels are not fast)"
    elif name == "dynamic int8 (Linear)":
        if device.type != "cpu":
            return "torch.ao's dynamic int8 runs on the CPU only"
        if not any(isinstance(m, nn.Linear) for m in model.modules()):
            return "no nn.Linear layer to quantize"
    elif name == "channels_last":
        return channels_last_reason(model, inputs)
    elif name == "fewer threads":
        if device.type != "cpu":
            return "the GPU runs the kernels; torch's CPU threads only prepare them"
        if torch.get_num_threads() == 1:
            return "torch already runs on one thread"
    return None


def _output_check(found: torch.Tensor, reference: torch.Tensor, bound: float) -> tuple[bool, str, float]:
    if found.shape != reference.shape:
        return False, f"failed: output shape {tuple(found.shape)}, the baseline's {tuple(reference.shape)}", math.inf
    error = relative_error(found.detach().float().cpu(), reference.detach().float().cpu())
    agreement = ""
    if reference.dim() == 2 and reference.shape[1] > 1:
        same = (found.float().argmax(1) == reference.float().argmax(1)).float().mean().item()
        agreement = f", same argmax for {same:.1%}"
    word = "passed" if error <= bound else "failed"
    return error <= bound, f"{word}: relative output error {error:.1e} (bound {bound:.0e}){agreement}", error


def try_inference_tricks(
    make_model: Callable[[], nn.Module],
    make_input: Callable[[], object],
    *,
    device: str | torch.device | None = None,
    tricks: Sequence[str] | None = None,
    budget_s: float = 60.0,
    exact_tolerance: float = 1e-3,
    lossy_tolerance: float = 0.05,
    progress: bool = True,
) -> AdviceReport:
    """Try every applicable inference trick on ``make_model``'s forward pass: check each, time those that pass.

    Args:
        make_model: returns a fresh model with the same weights on every call (put in eval mode here).
        make_input: returns the input: a tensor or a tuple of tensors (moved to the device).
        device, tricks, budget_s: as in ``try_training_tricks`` (tricks from ``INFERENCE_TRICKS``).
        exact_tolerance: relative output error allowed to a lossless trick (reordered float arithmetic).
        lossy_tolerance: the same for 16-bit and int8, whose error is the trick's price.
        progress: progress bars over the long steps (compiles, timing); the main command switches them off.

    ``torch.compile``'s first call is timed as a reader pays it: in fresh processes, with empty caches and with a
    warm on-disk cache (``compile_cost``, on the model exported with ``torch.export``), and the row says after how
    many calls it pays back. A model ``torch.export`` cannot export is timed in this process, and the row says so.
    "fewer threads" runs each call with half of torch's intra-op threads (``torch.set_num_threads``): on small
    inputs, handing the work to more threads can cost more than the parallel part saves.

    Raises:
        TypeError / ValueError: as ``try_training_tricks`` (each names the argument).
    """
    start = time.perf_counter()
    check_factory(make_model, "make_model", "lambda: torchvision.models.resnet18()")
    check_factory(make_input, "make_input", "lambda: torch.randn(8, 3, 224, 224)")
    budget_s = check_budget(budget_s)
    check_tolerances(exact_tolerance, lossy_tolerance)
    check_flag(progress, "progress")
    chosen = check_tricks(tricks, INFERENCE_TRICKS)
    dev = pick_device(device) if device is not None else pick_device()
    check_same_weights(make_model)
    inputs = move(as_tensors(make_input(), "make_input()"), dev)
    items = int(inputs[0].shape[0]) if inputs[0].dim() else 1
    base = _build(make_model, inputs, dev, InferenceSwitches())
    reference = base()
    call_seconds = time_first_call(base, device=dev)  # a second call: what the timing will cost per call
    env, probe = describe(), make_model()
    rows: dict[str, TrickRow] = {}
    calls: dict[str, Callable[[], object]] = {"baseline": base}
    compile_cost_found, compile_first = None, None  # torch.compile's first call, when it ran
    for name in chosen:
        reason = _not_applicable(name, probe, inputs, dev, env)
        if reason is not None:
            rows[name] = TrickRow(name, applies=False, reason=reason)
            continue
        if time.perf_counter() - start > 0.5 * budget_s:
            rows[name] = spent_row(name)
            continue
        try:
            note = ""
            if name == "torch.compile":
                call, compile_cost_found, compile_first, note = _compiled_call(make_model, inputs, dev, progress)
            elif name == "fewer threads":
                threads = fewer_threads()
                call = _build(make_model, inputs, dev, _switches_of(name))
                note = f"{threads} of {torch.get_num_threads()} threads"
            else:
                call = _build(make_model, inputs, dev, _switches_of(name))
            passed, text, error = _output_check(
                call(), reference, lossy_tolerance if name in LOSSY else exact_tolerance
            )
        except Exception as err:  # a trick that cannot run on this model is a row, never the report's end
            rows[name] = raised_row(name, err)
            continue
        rows[name] = TrickRow(
            name,
            applies=True,
            check=text,
            check_passed=passed,
            lines=LINES[name].replace("{threads}", str(fewer_threads())),
            note=note,
            errors=(("output", error),),
        )
        if passed:
            calls[name] = call
    comparison = time_passing(
        rows,
        calls,
        call_seconds=call_seconds,
        seconds_left=budget_s - (time.perf_counter() - start),
        unit="call",
        items=items,
        device=dev,
        memory=False,
        label="forward pass",
        progress=progress,
    )
    if comparison is not None and "torch.compile" in comparison.names:
        rows["torch.compile"] = with_break_even(
            rows["torch.compile"], comparison, compile_cost_found, compile_first, "calls"
        )
    report = AdviceReport(
        kind="inference",
        device=str(dev),
        rows=tuple(rows[n] for n in chosen),
        comparison=comparison,
        stacked=None,
        stacked_check="-",
        budget_s=budget_s,
        seconds_used=0.0,
    )
    stacked, stacked_check = None, "-"
    recommended = report.recommended
    if recommended and budget_s - (time.perf_counter() - start) < 2 * CALLS_PER_VARIANT * call_seconds:
        stacked_check = f"not run: the budget ran out (one call {call_seconds:.2f} s; raise budget_s)"
    elif recommended:
        try:
            switches = _combine([_switches_of(r.name) for r in recommended])
            call = _build(make_model, inputs, dev, switches)
            bound = lossy_tolerance if any(r.name in LOSSY for r in recommended) else exact_tolerance
            passed, stacked_check, _ = _output_check(call(), reference, bound)
            if passed:
                stacked = time_stacked(
                    base,
                    call,
                    seconds_left=budget_s - (time.perf_counter() - start),
                    items=items,
                    device=dev,
                    memory=False,
                    label="forward pass",
                    progress=progress,
                )
        except Exception as err:
            stacked_check = raised_row("stacked", err).check
    return replace(report, stacked=stacked, stacked_check=stacked_check, seconds_used=time.perf_counter() - start)
