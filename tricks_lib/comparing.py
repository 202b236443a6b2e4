"""Interleaved A/B timing: ``compare({"A": a, "B": b}, baseline="A")`` and its steps, read top to bottom.

Its budget knobs (time, rounds, warm-up, calls per block, the smallest effect called significant) are one
frozen value, ``Budget``, so the call keeps the arguments a reader passes.

``compare`` checks its arguments (``_check_compare_args``), optionally checks that every variant
returns what the baseline returns (``_check_results``), runs rounds (``_run_rounds``: one block of
every variant per round, in a shuffled order, optionally over fresh replicates), and reads the rows
(``_read_rows``): "1.8x faster" or "not significant". Its timed blocks are ``measure``'s
(``tricks_lib.timed_blocks``); the package root re-exports it.
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tricks_lib._validate import check_callable, check_flag, check_non_negative_int, check_positive
from tricks_lib.env import pick_device
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement, paired_row
from tricks_lib.progress import optional_progress_bar
from tricks_lib.stats import CONFIDENCE, DEFAULT_MIN_EFFECT, MIN_ROUNDS_FOR_VERDICT, paired_speedup
from tricks_lib.timed_blocks import Timer, default_min_run_time, make_timer, run_block, warm_up

if TYPE_CHECKING:
    from tricks_lib.memory import MemoryReport

__all__ = ["DEFAULT_BUDGET", "DEFAULT_MIN_ROUNDS", "SLOW_CALL_BUDGET_FACTOR", "TARGET_ROUNDS", "Budget", "compare"]

# compare()'s default round budget. A variant whose calls are short fills its time budget in about
# 2 * DEFAULT_MIN_ROUNDS rounds (each block is calibrated to budget / (2 * min_rounds)). A call that
# outlasts a block (a 46 ms ResNet-18 step against a 17 ms block) used to stop at the floor of 15
# rounds, where the 99% interval of a median spans ranks 3 to 13: wide enough that a 1.1x effect came
# and went between runs. So by default such a variant keeps going up to TARGET_ROUNDS rounds, as long
# as they fit in SLOW_CALL_BUDGET_FACTOR times the budget; slower calls stay at the floor.
DEFAULT_MIN_ROUNDS = 15
TARGET_ROUNDS = 30
SLOW_CALL_BUDGET_FACTOR = 4


@dataclass(frozen=True)
class Budget:
    """How long ``compare`` times, and how strictly it reads the result; the defaults suit most comparisons.

    Args:
        min_run_time: seconds of timed calls per variant at least (default 0.05 quick, 0.5 full).
        min_rounds / max_rounds: bounds on the number of rounds (at least 8: fewer cannot give a 99%
            interval). The default, None, adapts: at least 15 rounds, and a variant whose calls outlast
            a block keeps going up to 30 rounds while those fit in 4x ``min_run_time`` per variant, so a
            46 ms call gets the rounds a stable verdict needs; an explicit value is used as given.
        warmup: untimed calls of each variant before timing.
        number: calls per block for every variant; default: calibrated per variant so a block takes
            about ``min_run_time / (2 * min_rounds)``.
        min_effect: smallest relative difference ever called significant (0.03 = 3%).
        order_seed: seeds the per-round shuffle of the variant order.

    Raises:
        TypeError / ValueError: a knob of the wrong type or out of range (the message says which).
    """

    min_run_time: float | None = None
    min_rounds: int | None = None
    max_rounds: int = 1000
    warmup: int = 1
    number: int | None = None
    min_effect: float = DEFAULT_MIN_EFFECT
    order_seed: int = 0

    def __post_init__(self) -> None:
        check_positive(self.min_run_time, "min_run_time")
        check_positive(self.min_rounds, "min_rounds", integer=True)
        if self.min_rounds is not None and self.min_rounds < MIN_ROUNDS_FOR_VERDICT:
            raise ValueError(
                f"min_rounds must be at least {MIN_ROUNDS_FOR_VERDICT}: fewer rounds cannot give a "
                f"{CONFIDENCE:.0%} interval, so no difference could ever be called significant"
            )
        check_positive(self.max_rounds, "max_rounds", allow_none=False, integer=True)
        if self.max_rounds < self.rounds_at_least:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be at least min_rounds ({self.rounds_at_least})")
        check_non_negative_int(self.warmup, "warmup")
        check_positive(self.number, "number", integer=True)
        effect = self.min_effect
        if isinstance(effect, bool) or not isinstance(effect, (int, float)) or not 0 <= effect < 1:
            raise ValueError(f"min_effect must be a fraction in [0, 1), got {effect!r}")
        check_non_negative_int(self.order_seed, "order_seed")

    @property
    def rounds_at_least(self) -> int:
        return DEFAULT_MIN_ROUNDS if self.min_rounds is None else self.min_rounds

    @property
    def rounds_target(self) -> int:
        """Rounds a slow call may extend to: adaptive by default, exactly ``min_rounds`` when it is given."""
        target = TARGET_ROUNDS if self.min_rounds is None else self.min_rounds
        return min(max(target, self.rounds_at_least), self.max_rounds)


DEFAULT_BUDGET = Budget()


def _calibrate(timer: Timer, target_block: float) -> int:
    """Calls per block so that one block takes about ``target_block`` seconds (at least one call)."""
    number = 1
    while True:
        elapsed = run_block(timer, number)
        if elapsed >= target_block or number >= 1 << 30:
            return number
        # Grow towards the target, at most 10x per step, so a mis-estimate stays cheap.
        grow = target_block / max(elapsed, 1e-9)
        number = max(number + 1, int(number * min(grow * 1.1, 10.0)))


@dataclass(frozen=True)
class _CompareSpec:
    """compare()'s arguments, checked and resolved."""

    variants: dict[str, Callable[[], object]]
    baseline: str
    items: dict[str, int | None]
    per_item: bool
    run_time: float
    budget: Budget
    device: torch.device
    more_work: dict[str, str]
    replicates: int
    build: Callable[[], Mapping[str, Callable[[], object]]] | None


def _check_variants(variants: object, expected: list[str] | None = None) -> dict[str, Callable[[], object]]:
    """A dict of name -> callable; with ``expected``, a rebuilt one must name the same variants."""
    if not isinstance(variants, Mapping):
        raise TypeError(
            f"variants must be a dict of name -> callable (or a function that builds one), got {type(variants).__name__}"
        )
    if not variants:
        raise ValueError("variants is empty: pass at least the baseline, e.g. {'baseline': fn}")
    for name, fn in variants.items():
        if not isinstance(name, str):
            raise TypeError(f"variant names must be strings, got {name!r}")
        check_callable(fn, f"variant {name!r}")
    if expected is not None and list(variants) != expected:
        raise ValueError(
            f"the variants builder returned {list(variants)} after {expected}: it must build the same variants"
        )
    return dict(variants)


def _check_compare_args(variants, baseline, items, device, more_work, replicates, budget) -> _CompareSpec:
    if not isinstance(budget, Budget):
        raise TypeError(f"budget must be a tricks_lib.Budget (e.g. Budget(min_rounds=8)), got {type(budget).__name__}")
    check_positive(replicates, "replicates", allow_none=False, integer=True)
    build = None
    if callable(variants) and not isinstance(variants, Mapping):
        build = variants
        variants = build()
    elif replicates > 1:
        raise TypeError(
            "replicates > 1 needs variants as a function that builds the dict (e.g. lambda: {...}), so that "
            "each replicate runs on fresh models, tensors and loaders"
        )
    variants = _check_variants(variants)
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(variants)}")
    if isinstance(items, Mapping):
        unknown = set(items) - set(variants)
        if unknown:
            raise ValueError(f"items names unknown variants {sorted(unknown)}")
        for name, count in items.items():
            check_positive(count, f"items[{name!r}]", allow_none=False, integer=True)
    else:
        check_positive(items, "items", integer=True)
    more_work = {} if more_work is None else more_work
    if not isinstance(more_work, Mapping):
        raise TypeError(
            f"more_work must be a dict of heavier variant -> lighter variant, got {type(more_work).__name__}"
        )
    for heavy, light in more_work.items():
        if heavy not in variants or light not in variants:
            raise ValueError(f"more_work names {heavy!r} -> {light!r}, but the variants are {list(variants)}")
        if heavy == light:
            raise ValueError(f"more_work pairs {heavy!r} with itself: name the lighter variant it does more than")
    if replicates > budget.rounds_at_least:
        raise ValueError(
            f"replicates ({replicates}) cannot exceed min_rounds ({budget.rounds_at_least}): each replicate needs a round"
        )
    return _CompareSpec(
        variants=dict(variants),
        baseline=baseline,
        items={name: (items.get(name) if isinstance(items, Mapping) else items) for name in variants},
        per_item=isinstance(items, Mapping) and all(name in items for name in variants),
        run_time=budget.min_run_time or default_min_run_time(),
        budget=budget,
        device=pick_device(device) if device is not None else pick_device(),
        more_work=dict(more_work),
        replicates=replicates,
        build=build,
    )


def _run_rounds(
    spec: _CompareSpec, progress: bool
) -> tuple[dict[str, int], dict[str, list[float]], tuple[int, ...], dict[str, Callable[[], object]]]:
    """Warm up, calibrate, then time one block of every variant per round, in a shuffled order.

    With replicates, the rounds are split into that many stretches, each on variants built afresh
    (the first replicate calibrates the calls per block for all). Returns calls per block, per-call
    block times by variant (in round order, so they pair up), the rounds of each replicate, and the
    variants of the last replicate.
    """
    names = list(spec.variants)
    # A fixed order (A B C A B C ...) turns any steady position effect (a cache warmed by the variant
    # before, a frequency step at the start of a round) into a fake speedup; a seeded shuffle per
    # round spreads it over all variants and keeps the run repeatable.
    order_rng = random.Random(spec.budget.order_seed)
    block_times: dict[str, list[float]] = {name: [] for name in names}
    min_rounds = math.ceil(spec.budget.rounds_at_least / spec.replicates)
    max_rounds = max(min_rounds, spec.budget.max_rounds // spec.replicates)
    target_rounds = min(max_rounds, max(min_rounds, math.ceil(spec.budget.rounds_target / spec.replicates)))
    run_time = spec.run_time / spec.replicates
    slow_call_cap = SLOW_CALL_BUDGET_FACTOR * run_time * len(names)
    variants, numbers, per_replicate = spec.variants, None, []
    bar = optional_progress_bar(progress, min_rounds * spec.replicates, f"comparing {len(names)} variants")
    try:
        for replicate in range(spec.replicates):
            if replicate > 0:
                variants = None
                gc.collect()  # free the last replicate's state before building the next
                variants = _check_variants(spec.build(), names)
            for name in names:
                warm_up(variants[name], spec.device, spec.budget.warmup)
            timers = {name: make_timer(variants[name], spec.device, name) for name in names}
            if numbers is None:
                target_block = spec.run_time / (2 * spec.budget.rounds_at_least)
                numbers = {name: spec.budget.number or _calibrate(timers[name], target_block) for name in names}
            spent, rounds = 0.0, 0
            while rounds < max_rounds and (
                rounds < min_rounds
                or spent < run_time * len(names)
                or (rounds < target_rounds and spent * target_rounds / rounds <= slow_call_cap)
            ):
                order = names[:]
                order_rng.shuffle(order)
                for name in order:
                    elapsed = run_block(timers[name], numbers[name])
                    block_times[name].append(elapsed / numbers[name])
                    spent += elapsed
                rounds += 1
                if bar is not None:
                    bar.total = max(bar.total, sum(per_replicate) + rounds)
                    bar.update(1)
            per_replicate.append(rounds)
    finally:
        if bar is not None:
            bar.close()
    return numbers, block_times, tuple(per_replicate), variants


def _read_rows(
    spec: _CompareSpec,
    measurements: dict[str, Measurement],
    reports: dict[str, MemoryReport],
    replicate_rounds: tuple[int, ...],
) -> tuple[ComparisonRow, ...]:
    """Each variant against the baseline, and each declared heavier variant against its lighter one."""
    scale = {name: (spec.items[name] if spec.per_item else 1) for name in spec.variants}
    base = spec.baseline

    def paired(name: str, reference: str) -> tuple[float, float, float, bool]:
        return paired_speedup(
            measurements[reference].times,
            measurements[name].times,
            scale[reference],
            scale[name],
            spec.budget.min_effect,
        )

    rows = []
    for name, m in measurements.items():
        suspect = None
        lighter = spec.more_work.get(name)
        if lighter is not None:
            ratio, _, _, heavier_is_different = paired(name, lighter)
            if heavier_is_different and ratio > 1:
                suspect = (
                    f"does more work than {lighter!r} yet measured {ratio:.2f}x faster than it: a side "
                    "effect (run order, caches, memory allocation), not a speedup from the extra work"
                )
        rows.append(
            paired_row(
                m,
                measurements[base],
                min_effect=spec.budget.min_effect,
                scale=scale[name],
                base_scale=scale[base],
                replicate_rounds=replicate_rounds if spec.replicates > 1 else (),
                memory=reports.get(name),
                suspect=suspect,
            )
        )
    return tuple(rows)


def _checks_per_variant(
    check: Callable | Mapping[str, Callable], variants: Mapping[str, object], baseline: str
) -> dict[str, Callable]:
    """variant -> its check: one callable for all, or a mapping that names every variant but the baseline."""
    others = [name for name in variants if name != baseline]
    if not isinstance(check, Mapping):
        check_callable(check, "check")
        return dict.fromkeys(others, check)
    missing, unknown = [n for n in others if n not in check], [n for n in check if n not in others]
    if missing or unknown:
        raise ValueError(
            f"check must name every variant but the baseline {baseline!r}: missing {missing}, unknown {unknown}"
        )
    for name, fn in check.items():
        check_callable(fn, f"check[{name!r}]")
    return {name: check[name] for name in others}


def _check_results(variants: Mapping[str, Callable[[], object]], baseline: str, checks: Mapping[str, Callable]) -> None:
    """Call every variant once (untimed) and check its result against the baseline's, with its own check."""
    expected = variants[baseline]()
    for name, fn in variants.items():
        if name == baseline:
            continue
        try:
            checks[name](expected, fn())
        except Exception as err:
            raise ValueError(
                f"variant {name!r} does not return what {baseline!r} returns, so timing them would compare "
                f"different work: {type(err).__name__}: {err}"
            ) from err


def compare(
    variants: Mapping[str, Callable[[], object]] | Callable[[], Mapping[str, Callable[[], object]]],
    *,
    baseline: str,
    items: int | Mapping[str, int] | None = None,
    device: str | torch.device | None = None,
    memory: bool = False,
    label: str | None = None,
    check: Callable[[object, object], object] | Mapping[str, Callable[[object, object], object]] | None = None,
    more_work: Mapping[str, str] | None = None,
    replicates: int = 1,
    progress: bool = False,
    budget: Budget = DEFAULT_BUDGET,
) -> Comparison:
    """Time variants interleaved round by round and read each against ``baseline``.

    Each round runs one block of every variant, in an order shuffled per round (seeded), so slow
    drift of a shared machine (other jobs, thermal limits) hits all variants alike and no variant
    always runs first. A variant is "significant" when the whole 99% distribution-free interval of
    its paired per-round speedup lies at least ``budget.min_effect`` away from 1x (and the ratio of
    medians agrees); otherwise it is "not significant", never a speedup.

    Args:
        variants: name -> zero-argument callable; each must do the same work (check that first). Or a
            zero-argument function that builds that dict, called once per replicate.
        baseline: the name of the reference variant.
        items: things processed per call, one count for all or a dict name -> count. With a count
            for every variant, speedups compare time per item (throughput), not time per call.
        device: whose queue is synchronized around each block (default ``pick_device()``).
        memory: also run ``measure_memory`` once per variant (outside the timing) for the table.
        label: a title for the table.
        check: before anything is timed, ``check(baseline_result, variant_result)`` for every other
            variant, e.g. ``torch.testing.assert_close``; it raises when they differ (one untimed
            call each, on the first build). Lossy variants need a check with their tolerance: a mapping
            variant -> check gives each variant its own (``{"bf16": partial(assert_close, atol=1e-2),
            "fused": torch.testing.assert_close}``) and must name every variant but the baseline.
        more_work: heavier variant -> lighter variant, for pairs where the first does strictly more
            work than the second (the same decode plus a colour conversion). A heavier variant that
            comes out significantly faster than its lighter one gets ``row.suspect`` set, its outcome
            is ``Outcome.SUSPECT`` and its verdict says so: such a result is an artifact, not a speedup.
        replicates: split the rounds (and the time budget) into this many stretches, each on variants
            that ``variants()`` builds afresh. The paired interval only sees noise between rounds;
            where a result depends on state built once per run (where tensors landed in memory,
            worker start-up, page cache), a rerun gets another draw of it. With replicates, a variant
            is significant only when every replicate also shows at least ``min_effect`` in the same
            direction (``row.replicate_speedups``). This rules out state a rebuild redraws, not state
            a process draws once (worker start-up, CPU placement).
        progress: show a progress bar over the rounds (tqdm.auto); off by default.
        budget: how long to time and how strictly to read it (``Budget``: run time, rounds, warm-up,
            calls per block, the smallest effect called significant, the order seed).

    Raises:
        TypeError / ValueError: empty or non-dict ``variants``, a non-callable variant, an unknown
            ``baseline`` or ``more_work`` name, non-positive sizes, ``replicates`` > 1 with a dict
            instead of a builder, a builder that returns other variants the next time, a budget that
            is not a ``Budget``.
        ValueError: ``check`` raised for a variant (the message names it and keeps the check's own).
    """
    spec = _check_compare_args(variants, baseline, items, device, more_work, replicates, budget)
    check_flag(memory, "memory")
    check_flag(progress, "progress")
    if check is not None:
        _check_results(spec.variants, spec.baseline, _checks_per_variant(check, spec.variants, spec.baseline))
    numbers, block_times, replicate_rounds, variants = _run_rounds(spec, progress)
    reports = {}
    if memory:
        from tricks_lib.memory import measure_memory

        reports = {name: measure_memory(fn, label=name, device=spec.device) for name, fn in variants.items()}
    threads = torch.get_num_threads()
    measurements = {
        name: Measurement(
            label=name,
            times=tuple(block_times[name]),
            number_per_block=numbers[name],
            device=str(spec.device),
            num_threads=threads,
            items=spec.items[name],
        )
        for name in spec.variants
    }
    return Comparison(
        label=label or f"vs {baseline}",
        baseline=baseline,
        rows=_read_rows(spec, measurements, reports, replicate_rounds if spec.replicates > 1 else ()),
        rounds=sum(replicate_rounds),
        device=str(spec.device),
        num_threads=threads,
        min_effect=spec.budget.min_effect,
        per_item=spec.per_item,
        replicate_rounds=replicate_rounds if spec.replicates > 1 else (),
    )
