"""The results of a training ladder: each rung's runs over seeds, and the verdict of each rung.

``Ladder`` reads a rung against the rung before it: "faster" or "slower" only when the seeds' times
do not overlap; a rung that reused a graph the rung before compiled (one process runs the whole
ladder) is compared without the compile on both sides, since a reader's fresh process pays it again.
Time to target is epochs to target times the time per epoch: ``Ladder.epochs_change`` reads the first,
seed by seed (``EpochsChange``, an exact sign test), and the paired step comparison ``Ladder.steps``
(``run_ladder`` times it with ``compare``) reads the second. ``Ladder.reading`` reads the stack at the rung with the least mean time
to target among those that reached it in every seed (a ranking of means, not a test), and lists the
rungs that missed it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tricks_lib._validate import check_positive
from tricks_lib.formatting import format_bytes, format_seconds, markdown_table
from tricks_lib.ladder.config import LadderConfig, TrainingRun
from tricks_lib.outcome import Outcome

if TYPE_CHECKING:
    from tricks_lib.measurements import Comparison

__all__ = ["CompilePayback", "EpochsChange", "Ladder", "LadderReading", "Rung", "RungResult"]

EPOCHS_LEVEL = 0.05  # a change in epochs to target is read when its two-sided sign test has p at or below this


@dataclass(frozen=True)
class Rung:
    """One trick: a name, the ``LadderConfig`` fields it changes, why it is skipped here (None: it runs),
    and when it does not help (a fixed fact for the verdict table, never an outcome)."""

    name: str
    changes: dict = dataclasses.field(default_factory=dict)
    skip_reason: str | None = None
    caveat: str = ""

    @classmethod
    def adding(cls, *, caveat: str = "", skip_reason: str | None = None, **changes) -> Rung:
        """The rung that sets ``changes`` (``LadderConfig`` fields), named after them, so that the name says
        exactly what changed: ``Rung.adding(channels_last=True).name == "+ channels_last"``, and
        ``"+ batch_size=128, warmup_fraction=0.23"``, ``"+ autocast_dtype=bfloat16"``.

        Raises:
            ValueError: no change, or a field ``LadderConfig`` does not have.
        """
        if not changes:
            raise ValueError("Rung.adding() needs at least one LadderConfig field to change, e.g. channels_last=True")
        return cls("+ " + ", ".join(_change_name(k, v) for k, v in changes.items()), dict(changes), skip_reason, caveat)

    def __post_init__(self) -> None:

        unknown = set(self.changes) - {f.name for f in dataclasses.fields(LadderConfig)}
        if unknown:
            raise ValueError(f"rung {self.name!r} changes unknown LadderConfig fields {sorted(unknown)}")


def _change_name(field: str, value: object) -> str:
    if value is True:
        return field
    if isinstance(value, torch.dtype):
        return f"{field}={str(value).removeprefix('torch.')}"
    return f"{field}={value}"


def _spread(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class RungResult:
    """A rung's config and its runs (one per seed), or its skip reason; means and spreads over seeds."""

    name: str
    config: LadderConfig | None
    runs: tuple[TrainingRun, ...] = ()
    skip_reason: str | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None

    @property
    def reached(self) -> int:
        """Seeds that reached the target."""
        return sum(r.time_to_target is not None for r in self.runs)

    @property
    def epochs(self) -> tuple[int | None, ...]:
        """Epochs to target per seed (None: that seed missed the target)."""
        return tuple(r.trace.epochs_to_target for r in self.runs)

    @property
    def times(self) -> tuple[float, ...]:
        """Time to target per seed, for the seeds that reached it."""
        return tuple(r.time_to_target for r in self.runs if r.time_to_target is not None)

    @property
    def mean_time(self) -> float | None:
        """Mean time to target, None unless every seed reached it."""
        return statistics.fmean(self.times) if self.runs and self.reached == len(self.runs) else None

    @property
    def time_spread(self) -> float | None:
        return _spread(self.times) if self.mean_time is not None else None

    def mean(self, field: str) -> float | None:
        """Mean over seeds of a ``TrainingRun`` attribute (None where it is None, or when skipped)."""
        values = [getattr(r, field) for r in self.runs]
        return statistics.fmean(values) if values and None not in values else None

    def spread(self, field: str) -> float | None:
        values = [getattr(r, field) for r in self.runs]
        return _spread(values) if values and None not in values else None


def _after_compile(rung: RungResult) -> tuple[float, ...]:
    """Time to target per seed without the compile (all seeds reached the target)."""
    return tuple(r.time_to_target - (r.compile_seconds or 0.0) for r in rung.runs)


def _reused_compile(before: RungResult, rung: RungResult) -> bool:
    """True when ``before`` compiled and ``rung`` (compiled too) paid under a tenth of that: a reused graph."""
    paid, reused = before.mean("compile_seconds"), rung.mean("compile_seconds")
    return paid is not None and reused is not None and reused < 0.1 * paid


@dataclass(frozen=True)
class Ladder:
    """Every rung of a ladder, in order; each rung's config keeps the changes of the rungs before it."""

    rungs: tuple[RungResult, ...]
    data: str
    device: str
    target: float
    steps: Comparison | None = None  # each rung's training step timed against the others (paired), if timed

    def __getitem__(self, name: str) -> RungResult:
        for rung in self.rungs:
            if rung.name == name:
                return rung
        raise KeyError(f"no rung {name!r}; the rungs are {[r.name for r in self.rungs]}")

    @property
    def ran(self) -> tuple[RungResult, ...]:
        return tuple(r for r in self.rungs if not r.skipped)

    def previous(self, name: str) -> RungResult | None:
        """The last rung before ``name`` that ran (what ``name`` is compared with)."""
        ran = [r.name for r in self.ran]
        i = ran.index(name)
        return self[ran[i - 1]] if i > 0 else None

    def verdict(self, name: str) -> str:
        """``name``'s time to target against the rung before it: faster / slower when the seeds' ranges do
        not overlap, else "no clear change"; or how many seeds missed the target; or the skip reason."""
        return self._read(name, self._before(name), "the rung before")[1]

    def outcome(self, name: str) -> Outcome | None:
        """``name``'s time to target against the rung before it as a value (``verdict`` in words): faster or
        slower when the seeds' times do not overlap, else not significant; baseline for the first rung; None
        when there is no time to compare (skipped, or a side missed the target)."""
        return self._read(name, self._before(name), "the rung before")[0]

    def _before(self, name: str) -> str | None:
        before = None if self[name].skipped else self.previous(name)
        return None if before is None else before.name

    def _read(self, name: str, reference: str | None, label: str, *, fresh: bool = False) -> tuple[Outcome | None, str]:
        rung = self[name]
        if rung.skipped:
            return None, f"skipped: {rung.skip_reason}"
        if rung.mean_time is None:
            return None, f"missed the target in {len(rung.runs) - rung.reached} of {len(rung.runs)} seeds"
        if reference is None:
            return Outcome.BASELINE, "baseline"
        before = self[reference]
        if before.mean_time is None:
            return None, f"reached the target in every seed ({label} did not)"
        mine, theirs, note = rung.times, before.times, ""
        if fresh:  # both as a fresh process pays them: a reused graph's compile is added back
            mine, theirs = self.fresh_times(name), self.fresh_times(reference)
            paid = self._paid_compile(rung)
            note = "" if paid is None else f", the compile {paid.name} paid added back: a fresh process pays it"
        elif _reused_compile(before, rung):
            # The rung before paid the compile; this one reused its graph from the same process, which a
            # reader's fresh process would not: compare the training time after the compile on both sides.
            mine, theirs = _after_compile(rung), _after_compile(before)
            note = ", compile excluded on both sides: this rung reused the graph the rung before compiled"
        ratio = statistics.fmean(theirs) / statistics.fmean(mine)
        if max(mine) < min(theirs):
            return Outcome.FASTER, f"{ratio:.2f}x faster to target than {label} (no seed overlap{note})"
        if min(mine) > max(theirs):
            return Outcome.SLOWER, f"{1 / ratio:.2f}x slower to target than {label} (no seed overlap{note})"
        return Outcome.NOT_SIGNIFICANT, f"no clear change ({ratio:.2f}x; the seeds' times overlap{note})"

    def epochs_change(self, name: str, reference: str | None = None) -> EpochsChange | None:
        """``name``'s epochs to target against ``reference`` (default: the rung before it), seed by seed.

        Returns:
            An ``EpochsChange``; None for a skipped rung, or for the first rung without a ``reference``.

        Raises:
            KeyError: an unknown rung. ValueError: the two rungs did not train the same seeds.
        """
        rung = self[name]
        if rung.skipped:
            return None
        before = self.previous(name) if reference is None else self[reference]
        if before is None:
            return None
        if [r.seed for r in rung.runs] != [r.seed for r in before.runs]:
            raise ValueError(f"{name!r} and {before.name!r} trained other seeds: their epochs do not pair up")
        return EpochsChange(name, before.name, tuple(zip(before.epochs, rung.epochs)))

    def _paid_compile(self, rung: RungResult) -> RungResult | None:
        """The first compiled rung, when ``rung`` comes after it and reused its graph (None otherwise)."""
        if rung.mean("compile_seconds") is None:  # eager, or skipped
            return None
        first = next(r for r in self.ran if r.mean("compile_seconds") is not None)
        return first if first is not rung and _reused_compile(first, rung) else None

    def fresh_times(self, name: str) -> tuple[float, ...]:
        """Time to target per seed that reached it, as a reader's fresh process pays it: a rung that reused the
        graph the first compiled rung compiled in this process gets that rung's compile of the same seed added."""
        rung = self[name]
        paid = self._paid_compile(rung)
        if paid is None:
            return rung.times
        return tuple(
            r.time_to_target + (p.compile_seconds or 0.0)
            for r, p in zip(rung.runs, paid.runs)
            if r.time_to_target is not None
        )

    def best(self) -> str | None:
        """The rung with the least mean time to target (as a fresh process pays it, ``fresh_times``) among the
        rungs that reached the target in every seed; None when none did."""
        every_seed = [r.name for r in self.ran if r.mean_time is not None]
        return min(every_seed, key=lambda n: statistics.fmean(self.fresh_times(n)), default=None)

    def reading(self) -> LadderReading:
        """The ladder's verdicts grouped: which rungs bought time, which cost time, which changed nothing
        clearly, which missed the target or were skipped, and the stack read at the rung with the least
        mean time to target among those that reached it in every seed (``best``), against the baseline."""
        ran = self.ran[1:]
        best, base = self.best(), self.ran[0].name
        if best is None:
            stack = "no rung reached the target in every seed"
        elif best == base:
            stack = "no rung reached the target sooner on average than the baseline"
        else:
            stack = self._read(best, base, "the baseline", fresh=True)[1]
        return LadderReading(
            faster=tuple(r.name for r in ran if self.helped(r.name)),
            slower=tuple(r.name for r in ran if self.outcome(r.name) is Outcome.SLOWER),
            unclear=tuple(r.name for r in ran if self.outcome(r.name) is Outcome.NOT_SIGNIFICANT),
            missed=tuple(
                f"{r.name} ({len(r.runs) - r.reached} of {len(r.runs)} seeds)" for r in self.ran if r.mean_time is None
            ),
            skipped=tuple(f"{r.name} ({r.skip_reason})" for r in self.rungs if r.skipped),
            stack=stack,
            best=best,
            target=self.target,
        )

    def compile_payback(self, images_per_epoch: int) -> CompilePayback | None:
        """The first compiled rung's compile against the faster steps it buys (None: no compiled rung ran).

        The step speeds and the compiled step's paired verdict against the eager one come from ``steps`` (the
        step comparison, variants named as the rungs, ``items`` their batch sizes); without it, the speeds are
        the training runs' means (not paired, no verdict).

        Args:
            images_per_epoch: training images per epoch, to count the images one run trains.

        Raises:
            ValueError: the compiled rung is the baseline. KeyError: ``steps`` lacks either rung.
        """
        check_positive(images_per_epoch, "images_per_epoch", allow_none=False, integer=True)
        compiled = next((r for r in self.ran if r.config is not None and r.config.compile), None)
        if compiled is None:
            return None
        eager = self.previous(compiled.name)
        if eager is None:
            raise ValueError(f"the compiled rung {compiled.name!r} is the baseline: nothing eager to compare with")
        epochs = compiled.runs[0].trace.epochs_to_target
        speeds = (eager.mean("images_per_second"), compiled.mean("images_per_second"))
        step, steps = None, self.steps
        if steps is not None:
            step = steps.versus(compiled.name, eager.name)
            speeds = (steps[eager.name].measurement.items_per_second, step.measurement.items_per_second)
            if None in speeds:
                raise ValueError("steps must count the images of every step: compare(..., items={rung: batch size})")
        return CompilePayback(
            rung=compiled.name,
            compile_seconds=tuple(run.compile_seconds or 0.0 for run in compiled.runs),
            time_to_target=tuple(run.time_to_target for run in compiled.runs),
            eager_images_per_second=speeds[0],
            compiled_images_per_second=speeds[1],
            images_per_run=None if epochs is None else epochs * images_per_epoch,
            step_verdict=None if step is None else step.verdict,
            step_outcome=None if step is None else step.outcome,
        )

    def helped(self, name: str) -> bool:
        """True when ``name`` reached the target in every seed, clearly faster than the rung before."""
        return self.outcome(name) is Outcome.FASTER

    def _row(self, r: RungResult) -> list[str]:
        def pm(mean, spread, fmt):
            return "-" if mean is None else f"{fmt(mean)} ± {fmt(spread or 0.0)}"

        if r.skipped:
            return [r.name, "-", "-", "-", "-", "-", "-", self.verdict(r.name)]
        compile_s = r.mean("compile_seconds")
        memory = r.mean("peak_memory_bytes")
        return [
            r.name,
            pm(r.mean_time, r.time_spread, format_seconds)
            + ("" if r.mean_time else f" ({r.reached}/{len(r.runs)} reached)"),
            pm(r.mean("final_accuracy"), r.spread("final_accuracy"), lambda a: f"{a:.1%}"),
            ", ".join("-" if run.trace.epochs_to_target is None else str(run.trace.epochs_to_target) for run in r.runs),
            f"{r.mean('images_per_second'):,.0f}",
            "-" if compile_s is None else format_seconds(compile_s),
            format_bytes(memory) if memory is not None else f"{format_bytes(r.mean('saved_bytes'))} saved",
            self.verdict(r.name),
        ]

    def to_markdown(self) -> str:
        header = ["rung (cumulative)", "time to target (mean ± sd)", "final accuracy", "epochs (per seed)", "train images/s",
                  "compile", "peak memory (CPU: saved for backward, one step)", "verdict"]  # fmt: skip
        return markdown_table(header, [self._row(r) for r in self.rungs])

    # Markdown only (no _repr_html_, which Jupyter would prefer): the table renders as a table.
    def _repr_markdown_(self) -> str:
        seeds = max((len(r.runs) for r in self.rungs), default=0)
        return (
            f"**Time to {self.target:.0%} on {self.data}, {self.device}, {seeds} seed(s) per rung**\n\n"
            + self.to_markdown()
        )

    def __repr__(self) -> str:
        return f"Ladder({len(self.rungs)} rungs, target {self.target:.0%}, {self.data}, {self.device})"

    def plot(self, axes=None):
        """Two panels: time to target per rung (mean, one dot per seed), and final accuracy, under a title
        naming the target, the device and the seeds. Returns the axes."""
        import matplotlib.pyplot as plt

        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        ax_t, ax_a = axes
        names = [r.name for r in self.rungs]
        xs = range(len(names))
        for x, r in zip(xs, self.rungs):
            if r.skipped:
                ax_t.annotate("skipped", (x, 0), rotation=90, fontsize=7, color="0.5", ha="center", va="bottom")
                continue
            colour = (
                "tab:green" if self.helped(r.name) else "tab:red" if self.outcome(r.name) is Outcome.SLOWER else "0.5"
            )
            if r.mean_time is not None:
                ax_t.bar(x, r.mean_time, color=colour, alpha=0.6)
            ax_t.scatter([x] * len(r.times), r.times, color="k", s=10, zorder=3)
            accs = [run.final_accuracy for run in r.runs]
            ax_a.scatter([x] * len(accs), accs, color="k", s=10, zorder=3)
            ax_a.bar(x, statistics.fmean(accs), color="tab:blue", alpha=0.4)
        ax_a.axhline(self.target, color="tab:red", ls="--", lw=1, label=f"target {self.target:.0%}")
        ax_t.set_ylabel("time to target (s); dots: seeds")
        ax_a.set_ylabel("accuracy at the last evaluation")
        lows = [a for r in self.ran for a in (run.final_accuracy for run in r.runs)]
        ax_a.set_ylim(max(0.0, min(lows + [self.target]) - 0.05), min(1.0, max(lows + [self.target]) + 0.03))
        ax_a.legend(fontsize=8, loc="lower right")
        for ax in axes:
            ax.set_xticks(list(xs), names, rotation=40, ha="right", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        ax_t.set_title("green: clearly faster than the rung before; red: clearly slower", fontsize=9)
        seeds = max((len(r.runs) for r in self.rungs), default=0)
        fig = ax_t.figure
        fig.suptitle(f"Time to {self.target:.0%} test accuracy, one trick added per rung ({self.device}, {seeds} seeds)",
                     fontsize=10)  # fmt: skip
        fig.tight_layout()
        return axes


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) or "none"


@dataclass(frozen=True)
class LadderReading:
    """A ladder's verdicts grouped by outcome (``Ladder.reading()``); renders as a two-column table."""

    faster: tuple[str, ...]  # clearly faster than the rung before (no seed overlap)
    slower: tuple[str, ...]  # clearly slower than the rung before
    unclear: tuple[str, ...]  # the seeds' times overlap
    missed: tuple[str, ...]  # "name (k of n seeds)": a seed ended its schedule below the target
    skipped: tuple[str, ...]  # "name (reason)"
    stack: str  # the best rung's verdict against the baseline
    best: str | None  # least mean time to target of the rungs that reached it in every seed (None: none did)
    target: float

    @property
    def summary(self) -> str:
        """The stack in one sentence: the rung with the least mean time to target of those that reached it in every
        seed, its verdict against the baseline, and the rungs that missed it."""
        if self.best is None:
            head = f"no rung reached {self.target:.0%} in every seed"
        else:
            head = f"least mean time to {self.target:.0%} of the rungs that reached it in every seed: {self.best}, {self.stack}"
        return head + (f"; missed it in some seed: {_names(self.missed)}" if self.missed else "")

    def rows(self) -> list[list[str]]:
        return [
            ["clearly faster than the rung before", _names(self.faster)],
            ["clearly slower than the rung before", _names(self.slower)],
            ["no clear change", _names(self.unclear)],
            ["missed the target in some seed", _names(self.missed)],
            ["skipped here", _names(self.skipped)],
            [
                f"least mean time to target, of the rungs that reached it in every seed ({self.best or 'none'}), "
                "against the baseline",
                self.stack,
            ],
        ]

    def _repr_markdown_(self) -> str:
        return markdown_table(["outcome", "rungs"], self.rows())

    def __repr__(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.rows())


def _sign_test(fewer: int, more: int) -> float:
    """Exact two-sided sign test (scipy's binomial test at 1/2) over the seeds that moved; 1.0 when none did."""
    from scipy.stats import binomtest  # scipy: a dependency of scikit-learn, declared too

    n = fewer + more
    return 1.0 if n == 0 else float(binomtest(fewer, n, 0.5).pvalue)


def _epochs(e: int | None) -> float:
    return math.inf if e is None else e  # a seed that missed needs more epochs than the schedule has


@dataclass(frozen=True)
class EpochsChange:
    """Epochs to target of one rung against a reference rung, seed by seed (the same seeds: paired).

    A seed that missed the target counts as needing more epochs than the schedule has. The change is
    read with an exact two-sided sign test over the seeds whose epochs differ: "fewer" or "more" only
    when its p is at most ``EPOCHS_LEVEL`` (0.05). With n seeds the smallest p is 2 / 2**n, so it takes
    at least 6 seeds, all moving the same way, to read a change.
    """

    rung: str
    reference: str
    pairs: tuple[tuple[int | None, int | None], ...]  # (reference's epochs, the rung's epochs) per seed

    @property
    def fewer(self) -> int:
        return sum(_epochs(b) < _epochs(a) for a, b in self.pairs)

    @property
    def more(self) -> int:
        return sum(_epochs(b) > _epochs(a) for a, b in self.pairs)

    @property
    def same(self) -> int:
        return len(self.pairs) - self.fewer - self.more

    @property
    def p_value(self) -> float:
        return _sign_test(self.fewer, self.more)

    @property
    def smallest_p(self) -> float:
        """The smallest p these many seeds can give (every seed moving the same way)."""
        return _sign_test(len(self.pairs), 0)

    @property
    def direction(self) -> str | None:
        """ "fewer" or "more" epochs when the sign test reads a change, else None."""
        if self.p_value > EPOCHS_LEVEL:
            return None
        return "fewer" if self.fewer > self.more else "more"

    @property
    def verdict(self) -> str:
        counts = f"fewer in {self.fewer}, more in {self.more}, same in {self.same} of {len(self.pairs)} seeds"
        if self.direction is None:
            return f"no clear change in epochs ({counts}; sign test p = {self.p_value:.2f})"
        return f"{self.direction} epochs than {self.reference} ({counts}; sign test p = {self.p_value:.3f})"

    def __repr__(self) -> str:
        return f"EpochsChange({self.rung} vs {self.reference}: {self.verdict})"


@dataclass(frozen=True)
class CompilePayback:
    """The first compiled rung's compile seconds per seed against the images its faster steps need to repay them."""

    rung: str
    compile_seconds: tuple[float, ...]  # per seed; the first seed's is the cold compile
    time_to_target: tuple[float | None, ...]  # per seed, compile included
    eager_images_per_second: float  # the rung before (eager), compile excluded
    compiled_images_per_second: float
    images_per_run: int | None  # images the first seed trained to reach the target (None: it missed)
    # The compiled step against the eager one from a paired step comparison (None: speeds from the runs, unpaired)
    step_verdict: str | None = None
    step_outcome: Outcome | None = None

    @property
    def images_to_pay_back(self) -> float | None:
        """Training images after which the first seed's compile is repaid; None: the compiled step is not faster
        (with a paired step comparison: not significantly faster)."""
        if self.step_outcome is not None and self.step_outcome is not Outcome.FASTER:
            return None
        saved = 1 / self.eager_images_per_second - 1 / self.compiled_images_per_second  # seconds per image
        return self.compile_seconds[0] / saved if saved > 0 else None

    @property
    def paid_back_within_a_run(self) -> bool | None:
        """True when one run trains more images than the compile needs to be repaid (None: unknown)."""
        need = self.images_to_pay_back
        if self.images_per_run is None:
            return None
        return need is not None and self.images_per_run >= need

    def rows(self) -> list[list[str]]:
        need, within = self.images_to_pay_back, self.paid_back_within_a_run
        return [
            ["compile seconds per seed", ", ".join(format_seconds(s) for s in self.compile_seconds)],
            ["share of time to target", ", ".join("-" if t is None else f"{c / t:.0%}"
                                                  for c, t in zip(self.compile_seconds, self.time_to_target))],
            ["train images/s eager -> compiled" + (" (training runs)" if self.step_verdict is None else " (steps)"),
             f"{self.eager_images_per_second:,.0f} -> {self.compiled_images_per_second:,.0f}"],
            *([] if self.step_verdict is None else [["compiled step against the eager one (paired)", self.step_verdict]]),
            ["images until the cold compile is paid back",
             "never: the compiled step is not faster" if need is None else f"{need:,.0f}"],
            ["images one run trains here", "-" if self.images_per_run is None else f"{self.images_per_run:,}"],
            ["paid back within one run", "unknown (a seed missed)" if within is None else "yes" if within else "no"],
        ]  # fmt: skip

    def _repr_markdown_(self) -> str:
        return markdown_table([f"torch.compile ({self.rung})", "this run"], self.rows())

    def __repr__(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.rows())
