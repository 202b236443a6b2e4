"""Timing done right: warm-up, device sync, repeats, median and spread, interleaved A/B comparisons.

Built on ``torch.utils.benchmark.Timer`` (it runs the timed loops and keeps torch's thread count
fixed); this module adds the interleaving, the verdicts and the values the notebooks display.

- ``measure(fn)`` times one callable, like ``Timer.blocked_autorange``, and returns a ``Measurement``.
- ``compare({"A": a, "B": b}, baseline="A")`` times the variants round by round (A B A B ...), so that
  drift on a shared machine hits them alike, and says "1.8x faster" or "not significant".
"""

from __future__ import annotations

import html
import math
import timeit
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import logging
import numpy as np
import torch

from tricks_lib.env import pick_device, quick_mode

if TYPE_CHECKING:
    from tricks_lib.memory import MemoryReport


def _import_timer():
    # torch.utils.benchmark imports cpp_extension, which logs a CUDA_HOME warning on machines with a
    # CUDA toolkit but no GPU. Silence that one import without leaving the logger changed.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils.benchmark import Timer
    finally:
        logger.setLevel(level)
    return Timer


Timer = _import_timer()

__all__ = ["Comparison", "ComparisonRow", "Measurement", "compare", "format_seconds", "measure", "time_first_call"]

# IQR/median above this marks a measurement as noisy (the same threshold torch.utils.benchmark warns at).
NOISE_THRESHOLD = 0.10
# Differences smaller than this are never called a speedup, however consistent: a few percent is
# within what cache placement and frequency scaling move from run to run.
DEFAULT_MIN_EFFECT = 0.03
# Two-sided confidence level of the paired test behind "significant".
CONFIDENCE = 0.99
# The fewest paired rounds whose order-statistic interval for the median reaches CONFIDENCE.
MIN_ROUNDS_FOR_VERDICT = 8


def format_seconds(seconds: float) -> str:
    """A time with a readable unit: ``format_seconds(0.00123) == '1.23 ms'``."""
    if not math.isfinite(seconds):
        return str(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@dataclass(frozen=True)
class Measurement:
    """The timing of one callable: per-call times of each timed block, and their statistics.

    ``times`` holds one entry per timed block (seconds per call, the block's time divided by
    ``number_per_block``); ``median`` and ``iqr`` summarize them.
    """

    label: str
    times: tuple[float, ...]
    number_per_block: int
    device: str
    num_threads: int
    items: int | None = None
    median: float = field(init=False)
    iqr: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("a Measurement needs at least one timed block")
        if any(t < 0 or not math.isfinite(t) for t in self.times):
            raise ValueError("block times must be finite and non-negative")
        if self.items is not None and self.items <= 0:
            raise ValueError("items must be a positive count of things processed per call")
        arr = np.asarray(self.times, dtype=float)
        object.__setattr__(self, "median", float(np.median(arr)))
        object.__setattr__(self, "iqr", float(np.percentile(arr, 75) - np.percentile(arr, 25)))

    @property
    def relative_spread(self) -> float:
        """IQR / median (0 for a zero median)."""
        return self.iqr / self.median if self.median > 0 else 0.0

    @property
    def noisy(self) -> bool:
        """True when the spread is large against the median: read such a number with care."""
        return self.relative_spread > NOISE_THRESHOLD

    @property
    def items_per_second(self) -> float | None:
        if self.items is None or self.median <= 0:
            return None
        return self.items / self.median

    def __repr__(self) -> str:
        rate = f", {self.items_per_second:,.0f} items/s" if self.items_per_second else ""
        noise = ", noisy" if self.noisy else ""
        return (
            f"Measurement({self.label!r}: median {format_seconds(self.median)}, IQR "
            f"{format_seconds(self.iqr)}{rate}, {len(self.times)} blocks x {self.number_per_block}, "
            f"{self.device}, {self.num_threads} threads{noise})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "median_s": self.median,
            "iqr_s": self.iqr,
            "blocks": len(self.times),
            "number_per_block": self.number_per_block,
            "items_per_second": self.items_per_second,
            "noisy": self.noisy,
            "device": self.device,
            "num_threads": self.num_threads,
        }


def _finite_or_none(x: float) -> float | None:
    """JSON has no NaN or infinity: such values are written as null."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class ComparisonRow:
    """One variant of a comparison, read against the baseline."""

    name: str
    measurement: Measurement
    speedup: float  # baseline time / this time (per item when items differ): > 1 means faster
    ci_low: float  # confidence interval of the paired per-round speedup
    ci_high: float
    significant: bool
    is_baseline: bool
    memory: MemoryReport | None = None

    @property
    def verdict(self) -> str:
        if self.is_baseline:
            return "baseline"
        if not self.significant:
            return "not significant"
        if self.speedup >= 1:
            return f"{self.speedup:.2f}x faster"
        return f"{1 / self.speedup:.2f}x slower"

    def to_dict(self) -> dict:
        out = {"variant": self.name, **self.measurement.to_dict()}
        out.update(
            speedup=_finite_or_none(self.speedup),
            speedup_ci=[_finite_or_none(self.ci_low), _finite_or_none(self.ci_high)],
            significant=self.significant,
            verdict=self.verdict,
        )
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out


@dataclass(frozen=True)
class Comparison:
    """Variants timed interleaved round by round against a named baseline."""

    label: str
    baseline: str
    rows: tuple[ComparisonRow, ...]
    rounds: int
    device: str
    num_threads: int
    min_effect: float
    per_item: bool = False  # speedups compare time per item (variants process different counts)

    def __getitem__(self, name: str) -> ComparisonRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no variant {name!r}; variants are {[r.name for r in self.rows]}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rows)

    def _table(self) -> tuple[list[str], list[list[str]]]:
        with_items = any(r.measurement.items is not None for r in self.rows)
        with_memory = any(r.memory is not None for r in self.rows)
        header = ["variant", "median", "IQR", "speedup", "verdict"]
        if with_items:
            header.insert(3, "items/s")
        if with_memory:
            header += ["saved for backward", "peak allocated"]
        body = []
        for r in self.rows:
            m = r.measurement
            cells = [r.name, format_seconds(m.median), format_seconds(m.iqr), f"{r.speedup:.2f}x", r.verdict]
            if m.noisy:
                cells[2] += " (noisy)"
            if with_items:
                cells.insert(3, f"{m.items_per_second:,.0f}" if m.items_per_second else "-")
            if with_memory:
                from tricks_lib.memory import format_bytes

                mem = r.memory
                saved = format_bytes(mem.saved_bytes) if mem else "-"
                if mem and mem.peak_saved_bytes != mem.saved_bytes:
                    saved += f" (at most {format_bytes(mem.peak_saved_bytes)} at once)"
                cells.append(saved)
                peak = mem.peak_allocated_bytes if mem else None
                cells.append(format_bytes(peak) if peak is not None else f"n/a ({self.device})")
            body.append(cells)
        return header, body

    def _caption(self) -> str:
        return (
            f"{self.label}: {self.rounds} interleaved rounds on {self.device}, {self.num_threads} threads; "
            f"'significant' = the {CONFIDENCE:.0%} paired interval of the speedup lies at least "
            f"{self.min_effect:.0%} away from 1x"
            + ("; speedup per item, since the variants process different numbers of items" if self.per_item else "")
        )

    def to_markdown(self) -> str:
        header, body = self._table()
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        return f"{self._caption()}\n\n" + "\n".join(lines)

    def _repr_html_(self) -> str:
        header, body = self._table()
        th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
        return f"<table><caption>{html.escape(self._caption())}</caption><tr>{th}</tr>{trs}</table>"

    def __repr__(self) -> str:
        return self.to_markdown()

    def plot(self, ax=None):
        """Bars of each variant's median time with its IQR; returns the matplotlib Axes."""
        from tricks_lib.plot import speedup_bars

        return speedup_bars(self, ax=ax)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "baseline": self.baseline,
            "rounds": self.rounds,
            "device": self.device,
            "num_threads": self.num_threads,
            "rows": [r.to_dict() for r in self.rows],
        }


# --------------------------------------------------------------------------------------------------
# Argument checks shared by measure() and compare()


def _check_callable(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be a zero-argument callable (e.g. a lambda), got {type(fn).__name__}")


def _check_positive(value: object, name: str, *, allow_none: bool = True, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be a {'whole number' if integer else 'number'}, got {value!r}")
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be positive, got {value!r}")


def _check_non_negative_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")


def _default_min_run_time() -> float:
    # Quick mode only has to show that the code runs; full mode gives stable medians.
    return 0.05 if quick_mode() else 0.5


def _synced_timer(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for the device's queued work, so GPU kernels are fully counted."""
    if device.type == "cuda":

        def cuda_timer() -> float:
            torch.cuda.synchronize(device)
            return timeit.default_timer()

        return cuda_timer
    if device.type == "mps":

        def mps_timer() -> float:
            torch.mps.synchronize()
            return timeit.default_timer()

        return mps_timer
    return timeit.default_timer


def _make_timer(fn: Callable[[], object], device: torch.device, label: str) -> Timer:
    # num_threads: Timer defaults to 1 thread; keep the caller's setting so we time what they run.
    return Timer(
        stmt="fn()",
        globals={"fn": fn},
        timer=_synced_timer(device),
        num_threads=torch.get_num_threads(),
        label=label,
    )


def _run_block(timer: Timer, number: int) -> float:
    """Seconds for ``number`` back-to-back calls, without Timer.timeit's extra warm-up calls."""
    from torch.utils.benchmark.utils import common

    with common.set_torch_threads(timer._task_spec.num_threads):
        return timer._timeit(number)


def _warm_up(fn: Callable[[], object], device: torch.device, calls: int) -> None:
    for _ in range(calls):
        fn()
    clock = _synced_timer(device)
    clock()  # drain queued device work so it is not billed to the first timed block


def measure(
    fn: Callable[[], object],
    *,
    label: str | None = None,
    items: int | None = None,
    min_run_time: float | None = None,
    device: str | torch.device | None = None,
    warmup: int = 1,
) -> Measurement:
    """Time ``fn()``: warm-up calls, then ``Timer.blocked_autorange`` with the device synchronized.

    Args:
        fn: a zero-argument callable doing the work once.
        label: a name for the result (default: the callable's name).
        items: things processed per call (samples, images); gives ``items_per_second``.
        min_run_time: seconds of timed calls at least (default 0.05 in quick mode, 0.5 otherwise).
        device: whose queue is synchronized around each timed block (default: ``pick_device()``).
        warmup: untimed calls first (first-call costs: allocation, autotuning, lazy init).

    Returns:
        A frozen ``Measurement``.

    Raises:
        TypeError / ValueError: a non-callable ``fn`` or a non-positive ``items``/``min_run_time``.
    """
    _check_callable(fn, "fn")
    _check_positive(items, "items", integer=True)
    _check_positive(min_run_time, "min_run_time")
    _check_non_negative_int(warmup, "warmup")
    dev = pick_device(device) if device is not None else pick_device()
    name = label if label is not None else getattr(fn, "__name__", "fn")
    _warm_up(fn, dev, warmup)
    timer = _make_timer(fn, dev, name)
    result = timer.blocked_autorange(min_run_time=min_run_time or _default_min_run_time())
    return Measurement(
        label=name,
        times=tuple(float(t) for t in result.times),
        number_per_block=int(result.number_per_run),
        device=str(dev),
        num_threads=torch.get_num_threads(),
        items=items,
    )


def time_first_call(fn: Callable[[], object], *, device: str | torch.device | None = None) -> float:
    """Seconds of one call of ``fn``, device synchronized before and after: a first-call cost, on purpose.

    Use it for what ``measure`` deliberately hides: lazy initialization, kernel autotuning,
    ``torch.compile``'s compilation. Only meaningful for a call that has not happened before.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    _check_callable(fn, "fn")
    clock = _synced_timer(pick_device(device) if device is not None else pick_device())
    start = clock()
    fn()
    return clock() - start


def _calibrate(timer: Timer, target_block: float) -> int:
    """Calls per block so that one block takes about ``target_block`` seconds (at least one call)."""
    number = 1
    while True:
        elapsed = _run_block(timer, number)
        if elapsed >= target_block or number >= 1 << 30:
            return number
        # Grow towards the target, at most 10x per step, so a mis-estimate stays cheap.
        grow = target_block / max(elapsed, 1e-9)
        number = max(number + 1, int(number * min(grow * 1.1, 10.0)))


def _median_interval(values: list[float], confidence: float) -> tuple[float, float] | None:
    """Distribution-free confidence interval for the median (order statistics of a binomial).

    None when there are too few values to reach ``confidence`` at all.
    """
    n = len(values)
    xs = sorted(values)
    alpha = 1.0 - confidence
    # Largest k with P(Binom(n, 1/2) < k) <= alpha/2: then [x_(k), x_(n-k+1)] covers the median.
    cdf, k = 0.0, 0
    for j in range(n + 1):
        p = math.comb(n, j) / 2.0**n
        if cdf + p > alpha / 2:
            break
        cdf += p
        k = j + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def compare(
    variants: Mapping[str, Callable[[], object]],
    *,
    baseline: str,
    items: int | Mapping[str, int] | None = None,
    min_run_time: float | None = None,
    min_rounds: int = 15,
    max_rounds: int = 1000,
    device: str | torch.device | None = None,
    warmup: int = 1,
    number: int | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    memory: bool = False,
    label: str | None = None,
) -> Comparison:
    """Time variants interleaved round by round and read each against ``baseline``.

    Each round runs one block of every variant in order (A B C A B C ...), so slow drift of a
    shared machine (other jobs, thermal limits) hits all variants alike. A variant is "significant"
    when the whole 99% distribution-free interval of its paired per-round speedup lies at least
    ``min_effect`` away from 1x (and the ratio of medians agrees); otherwise it is "not
    significant", never a speedup.

    Args:
        variants: name -> zero-argument callable; each must do the same work (check that first).
        baseline: the name of the reference variant.
        items: things processed per call, one count for all or a dict name -> count. With a count
            for every variant, speedups compare time per item (throughput), not time per call.
        min_run_time: seconds of timed calls per variant at least (default 0.05 quick, 0.5 full).
        min_rounds / max_rounds: bounds on the number of rounds (at least 8: fewer cannot give a
            99% interval).
        device: whose queue is synchronized around each block (default ``pick_device()``).
        warmup: untimed calls of each variant before timing.
        number: calls per block for every variant; default: calibrated per variant so a block
            takes about ``min_run_time / (2 * min_rounds)``.
        min_effect: smallest relative difference ever called significant (0.03 = 3%).
        memory: also run ``measure_memory`` once per variant (outside the timing) for the table.
        label: a title for the table.

    Raises:
        TypeError / ValueError: empty or non-dict ``variants``, a non-callable variant, an unknown
            ``baseline``, non-positive sizes or durations.
    """
    if not isinstance(variants, Mapping):
        raise TypeError(f"variants must be a dict of name -> callable, got {type(variants).__name__}")
    if not variants:
        raise ValueError("variants is empty: pass at least the baseline, e.g. {'baseline': fn}")
    for name, fn in variants.items():
        if not isinstance(name, str):
            raise TypeError(f"variant names must be strings, got {name!r}")
        _check_callable(fn, f"variant {name!r}")
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(variants)}")
    if isinstance(items, Mapping):
        unknown = set(items) - set(variants)
        if unknown:
            raise ValueError(f"items names unknown variants {sorted(unknown)}")
        for name, count in items.items():
            _check_positive(count, f"items[{name!r}]", allow_none=False, integer=True)
    else:
        _check_positive(items, "items", integer=True)
    _check_positive(min_run_time, "min_run_time")
    _check_positive(min_rounds, "min_rounds", allow_none=False, integer=True)
    if min_rounds < MIN_ROUNDS_FOR_VERDICT:
        raise ValueError(
            f"min_rounds must be at least {MIN_ROUNDS_FOR_VERDICT}: fewer rounds cannot give a "
            f"{CONFIDENCE:.0%} interval, so no difference could ever be called significant"
        )
    _check_positive(max_rounds, "max_rounds", allow_none=False, integer=True)
    if max_rounds < min_rounds:
        raise ValueError(f"max_rounds ({max_rounds}) must be at least min_rounds ({min_rounds})")
    _check_non_negative_int(warmup, "warmup")
    _check_positive(number, "number", integer=True)
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be a fraction in [0, 1), got {min_effect!r}")

    dev = pick_device(device) if device is not None else pick_device()
    run_time = min_run_time or _default_min_run_time()
    names = list(variants)
    for name in names:
        _warm_up(variants[name], dev, warmup)
    timers = {name: _make_timer(variants[name], dev, name) for name in names}
    target_block = run_time / (2 * min_rounds)
    numbers = {name: number or _calibrate(timers[name], target_block) for name in names}

    block_times: dict[str, list[float]] = {name: [] for name in names}
    spent = 0.0
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or spent < run_time * len(names)):
        for name in names:
            elapsed = _run_block(timers[name], numbers[name])
            block_times[name].append(elapsed / numbers[name])
            spent += elapsed
        rounds += 1

    reports = {}
    if memory:
        from tricks_lib.memory import measure_memory

        reports = {name: measure_memory(variants[name], label=name, device=dev) for name in names}

    threads = torch.get_num_threads()
    measurements = {
        name: Measurement(
            label=name,
            times=tuple(block_times[name]),
            number_per_block=numbers[name],
            device=str(dev),
            num_threads=threads,
            items=items.get(name) if isinstance(items, Mapping) else items,
        )
        for name in names
    }
    # Variants that process different numbers of items (batch sizes) are compared per item, i.e. by
    # throughput; otherwise per call.
    per_item = isinstance(items, Mapping) and all(name in items for name in names)
    scale = {name: (items[name] if per_item else 1) for name in names}
    base = measurements[baseline]
    base_time = base.median / scale[baseline]
    rows = []
    for name in names:
        m = measurements[name]
        speedup = base_time / (m.median / scale[name]) if m.median > 0 else math.inf
        # Paired per-round log speedups: both blocks of a round saw the same machine state.
        logs = [
            math.log((b / scale[baseline]) / (v / scale[name]))
            for b, v in zip(block_times[baseline], block_times[name])
            if b > 0 and v > 0
        ]
        interval = _median_interval(logs, CONFIDENCE) if name != baseline else None
        lo, hi = (math.exp(interval[0]), math.exp(interval[1])) if interval else (math.nan, math.nan)
        # The whole interval must clear the minimum effect, not just exclude 1x: a steady bias of a
        # percent or two (which variant runs first in a round, cache placement) is consistent enough
        # to exclude 1x, yet it is not a speedup. The ratio of medians must agree in direction.
        faster, slower = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
        significant = interval is not None and (
            (lo >= faster and speedup >= faster) or (hi <= slower and speedup <= slower)
        )
        if name == baseline:
            lo = hi = 1.0
        rows.append(
            ComparisonRow(
                name=name,
                measurement=m,
                speedup=speedup,
                ci_low=lo,
                ci_high=hi,
                significant=significant,
                is_baseline=name == baseline,
                memory=reports.get(name),
            )
        )
    return Comparison(
        label=label or f"vs {baseline}",
        baseline=baseline,
        rows=tuple(rows),
        rounds=rounds,
        device=str(dev),
        num_threads=threads,
        min_effect=float(min_effect),
        per_item=per_item,
    )

