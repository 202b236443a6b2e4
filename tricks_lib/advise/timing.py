"""What the training and the inference reports share once their checks ran: the rows for a trick that raised or
found the budget spent, which tricks the timing can afford, the interleaved comparison of those against the
baseline (each row then read from it), and the stacked run against the baseline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from tricks_lib.advise.report import TrickRow
from tricks_lib.comparing import Budget, compare
from tricks_lib.measurements import Comparison

__all__ = [
    "CALLS_PER_VARIANT",
    "TIMED_ROUNDS",
    "plan_timing",
    "raised_row",
    "spent_row",
    "time_passing",
    "time_stacked",
]

# One timed variant costs about this many calls: the rounds compare needs for a verdict, its warm-up and
# calibration calls, and the memory measurement.
TIMED_ROUNDS = 8
CALLS_PER_VARIANT = TIMED_ROUNDS + 3


def raised_row(name: str, err: BaseException) -> TrickRow:
    """A trick that raised while it was built or checked: a row with the error's first line, never the report's end."""
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return TrickRow(name, applies=True, check=f"raised {type(err).__name__}: {first_line[:200]}")


def spent_row(name: str) -> TrickRow:
    return TrickRow(name, applies=True, check="not run: half the time budget went to the builds and checks")


def plan_timing(candidates: Sequence[str], call_seconds: float, seconds_left: float) -> tuple[list[str], float]:
    """The tricks one interleaved comparison can time in ``seconds_left`` (besides the baseline), and the
    ``min_run_time`` of each variant; a quarter of what is left stays for the stacked run."""
    usable = 0.75 * seconds_left
    cost = CALLS_PER_VARIANT * max(call_seconds, 1e-4)
    fits = max(0, int(usable // cost) - 1)
    chosen = list(candidates[:fits])
    return chosen, max(0.05, 0.4 * usable / (len(chosen) + 1))


def time_passing(
    rows: dict[str, TrickRow],
    variants: Mapping[str, Callable[[], object]],
    *,
    call_seconds: float,
    seconds_left: float,
    unit: str,
    items: int,
    device: torch.device,
    memory: bool,
    label: str,
    progress: bool,
) -> Comparison | None:
    """Time ``variants`` (the baseline first, then the tricks that passed) in one interleaved comparison, as many
    as the budget affords; fill each timed trick's row from it and say in the others' why they were not timed."""
    tricks = [n for n in variants if n != "baseline"]
    timed, per_variant = plan_timing(tricks, call_seconds, seconds_left)
    for name in tricks[len(timed) :]:
        rows[name] = replace(
            rows[name], note=f"not timed: the budget ran out (one {unit} {call_seconds:.2f} s; raise budget_s)"
        )
    if not timed:
        return None
    comparison = compare(
        {n: variants[n] for n in ("baseline", *timed)},
        baseline="baseline",
        items=items,
        device=device,
        memory=memory,
        budget=Budget(min_run_time=per_variant, min_rounds=TIMED_ROUNDS),
        label=f"{label}, {len(timed)} tricks against the baseline",
        progress=progress,
    )
    for name in timed:
        r = comparison[name]
        rows[name] = replace(
            rows[name],
            outcome=r.outcome,
            speedup=r.speedup,
            speedup_low=r.ci_low,
            speedup_high=r.ci_high,
            saved_bytes=r.memory.saved_bytes if r.memory else None,
            peak_allocated_bytes=r.memory.peak_extra_bytes if r.memory else None,
        )
    return comparison


def time_stacked(
    baseline: Callable[[], object],
    stacked: Callable[[], object],
    *,
    seconds_left: float,
    items: int,
    device: torch.device,
    memory: bool,
    label: str,
    progress: bool,
) -> Comparison:
    """The recommended tricks together against the baseline, with what is left of the budget."""
    return compare(
        {"baseline": baseline, "stacked": stacked},
        baseline="baseline",
        items=items,
        device=device,
        memory=memory,
        budget=Budget(min_run_time=max(0.05, 0.3 * max(seconds_left, 0.05)), min_rounds=TIMED_ROUNDS),
        label=f"{label}, the recommended tricks stacked",
        progress=progress,
    )
