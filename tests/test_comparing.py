"""tricks_lib: known costs, interleaving, significance, and argument errors."""

import math
import re
import time

import pytest
import torch

from tricks_lib.comparing import Budget, compare
from tricks_lib.formatting import format_seconds
from tricks_lib.measurements import Comparison, Measurement
from tricks_lib.stats import median_interval
from tricks_lib.timing import measure, time_first_call


def busy(seconds):
    """A workload of known wall-clock cost: spin until `seconds` have passed."""

    def spin():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return spin


def test_measure_known_cost_is_never_under_reported():
    # A 2 ms spin can only be stretched by preemption, never shortened: every median is >= 2 ms. No
    # upper bound here: a loaded machine stretches a whole measurement (one failed 4 of 6 runs so).
    # How exactly the harness reads block times is tested with the fake clock below.
    runs = [measure(busy(0.002), label="2 ms", min_run_time=0.1, device="cpu") for _ in range(3)]
    m = min(runs, key=lambda r: r.median)
    assert isinstance(m, Measurement)
    assert all(r.median >= 0.002 for r in runs)
    assert m.iqr >= 0 and len(m.times) >= 1
    assert m.device == "cpu" and m.num_threads == torch.get_num_threads()


def test_measure_items_per_second_and_repr():
    m = measure(busy(0.001), items=100, min_run_time=0.05, device="cpu")
    assert m.items_per_second == pytest.approx(100 / m.median)
    assert "items/s" in repr(m)
    assert m.to_dict()["median_s"] == m.median


def test_measure_runs_warmup_before_timing(monkeypatch):
    import tricks_lib.comparing
    import tricks_lib.timed_blocks
    import tricks_lib.timing

    calls = []
    calls_when_timing_starts = []
    make_timer = tricks_lib.timed_blocks.make_timer

    def spy(fn, device, label, clock=None):
        calls_when_timing_starts.append(len(calls))
        return make_timer(fn, device, label, clock)

    monkeypatch.setattr(tricks_lib.timing, "make_timer", spy)
    monkeypatch.setattr(tricks_lib.comparing, "make_timer", spy)
    measure(lambda: calls.append(1), warmup=3, min_run_time=0.01, device="cpu")
    assert calls_when_timing_starts == [3]
    calls.clear()
    calls_when_timing_starts.clear()
    compare(
        {"a": lambda: calls.append(1), "b": lambda: calls.append(1)},
        baseline="a",
        budget=Budget(warmup=2, number=1, min_rounds=8, max_rounds=8),
        device="cpu",
    )
    assert calls_when_timing_starts == [4, 4]  # both variants warmed up twice before any timer exists


def test_measurement_statistics_match_numpy_definition():
    m = Measurement(label="x", times=(1.0, 2.0, 3.0, 4.0, 100.0), number_per_block=1, device="cpu", num_threads=1)
    assert m.median == 3.0
    assert m.iqr == pytest.approx(4.0 - 2.0)
    assert m.noisy  # IQR/median = 0.67
    quiet = Measurement(label="x", times=(1.0, 1.01, 0.99), number_per_block=1, device="cpu", num_threads=1)
    assert not quiet.noisy


def test_interleaving_order_is_round_by_round():
    log = []
    compare(
        {"A": lambda: log.append("A"), "B": lambda: log.append("B")},
        baseline="A",
        budget=Budget(number=1, warmup=0, min_rounds=8, max_rounds=8),
        device="cpu",
    )
    rounds = [log[i : i + 2] for i in range(0, len(log), 2)]
    assert len(rounds) == 8 and all(sorted(r) == ["A", "B"] for r in rounds)  # one block of each per round


def test_variant_order_is_shuffled_per_round_and_seeded():
    def run(seed):
        log = []
        compare(
            {name: (lambda n=name: log.append(n)) for name in "ABCD"},
            baseline="A",
            budget=Budget(number=1, warmup=0, min_rounds=12, max_rounds=12, order_seed=seed),
            device="cpu",
        )
        return [tuple(log[i : i + 4]) for i in range(0, len(log), 4)]

    rounds = run(0)
    assert all(sorted(r) == list("ABCD") for r in rounds)
    assert len({r[0] for r in rounds}) > 1  # not always the same variant first
    assert run(0) == rounds  # repeatable
    assert run(1) != rounds


def test_a_position_effect_is_not_read_as_a_speedup(monkeypatch):
    # The first block of every round is 10% slower (a cold cache, a frequency step). With a fixed
    # order the variant that always runs first looks 1.10x slower than its identical twin.
    import tricks_lib.comparing as bench

    blocks = []

    def run_block(timer, number):
        position = len(blocks) % 2
        blocks.append(timer._task_spec.label)
        return number * 1e-3 * (1.10 if position == 0 else 1.0)

    monkeypatch.setattr(bench, "run_block", run_block)
    monkeypatch.setattr(bench, "_calibrate", lambda timer, target: 1)
    c = compare(
        {"A": lambda: None, "A again": lambda: None},
        baseline="A",
        budget=Budget(warmup=0, min_rounds=40, max_rounds=40),
        device="cpu",
    )
    assert not c["A again"].significant, c


def test_heavier_variant_measured_faster_is_flagged(monkeypatch):
    fake_clock(monkeypatch, {"decode": 2e-3, "decode + convert": 1e-3, "decode twice": 4e-3})
    c = compare(
        {"decode": lambda: None, "decode + convert": lambda: None, "decode twice": lambda: None},
        baseline="decode",
        budget=Budget(min_run_time=0.5),
        device="cpu",
        more_work={"decode + convert": "decode", "decode twice": "decode"},
    )
    flagged = c["decode + convert"]
    assert flagged.suspect is not None and "more work than 'decode'" in flagged.suspect
    assert "suspect" in flagged.verdict and flagged.to_dict()["suspect"] == flagged.suspect
    assert c["decode twice"].suspect is None  # slower, as it should be
    assert c["decode"].suspect is None


def test_versus_reads_one_variant_against_another(monkeypatch):
    fake_clock(monkeypatch, {"a": 1e-3, "b": 2e-3, "c": 4e-3})
    c = compare(
        {"a": lambda: None, "b": lambda: None, "c": lambda: None},
        baseline="a",
        budget=Budget(min_run_time=0.5),
        device="cpu",
    )
    c_vs_b = c.versus("c", "b")
    assert c_vs_b.speedup == pytest.approx(0.5, rel=0.03) and c_vs_b.significant
    assert c_vs_b.verdict.endswith("x slower") and c_vs_b.ci_high < 1
    assert c.versus("b", "b").is_baseline
    with pytest.raises(KeyError):
        c.versus("c", "zz")


def test_a_slow_call_still_gets_a_spread_estimate():
    # One call outlasts min_run_time: Timer.blocked_autorange alone returns a single block (IQR 0).
    m = measure(busy(0.02), min_run_time=0.005, warmup=0, device="cpu")
    assert len(m.times) >= 3 and m.has_spread
    one = Measurement(label="x", times=(1.0,), number_per_block=1, device="cpu", num_threads=1)
    assert not one.has_spread and one.noisy  # unknown spread is never reported as quiet
    assert "no spread estimate" in repr(one)
    two = measure(busy(0.02), min_run_time=0.005, warmup=0, device="cpu", min_blocks=1)
    assert two.noisy == (not two.has_spread or two.relative_spread > 0.1)


def test_progress_bars_do_not_change_results(capsys, monkeypatch):
    monkeypatch.delenv("TRICKS_PROGRESS", raising=False)
    c = compare(
        {"a": busy(0.0005), "b": busy(0.0005)},
        baseline="a",
        budget=Budget(min_rounds=8, min_run_time=0.01),
        device="cpu",
        progress=True,
    )
    assert c.rounds >= 8
    m = measure(busy(0.0005), min_run_time=0.01, device="cpu", progress=True)
    assert len(m.times) >= 3


def test_identical_variants_are_not_significant():
    work = busy(0.001)
    c = compare(
        {"A": work, "A again": work}, baseline="A", budget=Budget(min_rounds=20, min_run_time=0.04), device="cpu"
    )
    row = c["A again"]
    assert not row.significant
    assert row.verdict == "not significant"
    assert c["A"].verdict == "baseline"


def test_real_difference_is_significant_with_the_right_direction(monkeypatch):
    fake_clock(monkeypatch, {"fast": 1e-3, "slow": 2e-3}, noise=0.05)
    c = compare(
        {"fast": lambda: None, "slow": lambda: None}, baseline="fast", budget=Budget(min_run_time=0.5), device="cpu"
    )
    slow = c["slow"]
    assert slow.significant
    assert slow.speedup == pytest.approx(0.5, rel=0.05)
    assert re.fullmatch(r"(1\.9\d|2\.0\d)x slower", slow.verdict)
    assert slow.ci_high < 1.0


def fake_clock(monkeypatch, seconds_per_call, noise=0.01, seed=0):
    """Replace the timed loop: each block takes `number` x the variant's cost, with +-noise jitter.

    Tests the statistics deterministically, whatever else the machine is doing."""
    import random

    import tricks_lib.comparing as bench

    rng = random.Random(seed)

    def run_block(timer, number):
        return number * seconds_per_call[timer._task_spec.label] * (1 + rng.uniform(-noise, noise))

    monkeypatch.setattr(bench, "run_block", run_block)


def test_small_consistent_difference_is_not_a_speedup(monkeypatch):
    # 4% more work is a real, consistent difference, but below the 5% minimum effect: about what a
    # speedup moves between two runs of the main command on a shared machine (stats.DEFAULT_MIN_EFFECT).
    fake_clock(monkeypatch, {"a": 1e-3, "b": 1.04e-3})
    c = compare({"a": lambda: None, "b": lambda: None}, baseline="a", budget=Budget(min_run_time=0.5), device="cpu")
    assert c["b"].ci_high < 1.0  # consistently slower...
    assert not c["b"].significant  # ...but not by enough to be called anything
    fake_clock(monkeypatch, {"a": 1e-3, "b": 1.3e-3})
    strict = compare(
        {"a": lambda: None, "b": lambda: None},
        baseline="a",
        budget=Budget(min_run_time=0.5, min_effect=0.05),
        device="cpu",
    )
    assert strict["b"].significant and strict["b"].speedup == pytest.approx(1 / 1.3, rel=0.02)


def test_noise_alone_is_not_significant(monkeypatch):
    fake_clock(monkeypatch, {"a": 1e-3, "b": 1e-3}, noise=0.2)
    c = compare({"a": lambda: None, "b": lambda: None}, baseline="a", budget=Budget(min_run_time=0.5), device="cpu")
    assert not c["b"].significant and c["b"].verdict == "not significant"


def test_compare_items_per_variant_compares_throughput(monkeypatch):
    # b takes twice as long per call but does four times the items: twice the throughput.
    fake_clock(monkeypatch, {"a": 1e-3, "b": 2e-3})
    c = compare(
        {"a": lambda: None, "b": lambda: None},
        baseline="a",
        items={"a": 10, "b": 40},
        budget=Budget(min_run_time=0.5),
        device="cpu",
    )
    assert c["b"].measurement.items == 40 and c.per_item
    assert c["b"].speedup == pytest.approx(2.0, rel=0.02)
    assert re.fullmatch(r"(1\.9\d|2\.0\d)x faster", c["b"].verdict)
    assert c["b"].measurement.items_per_second == pytest.approx(40 / 2e-3, rel=0.02)
    assert "items/s" in c.to_markdown() and "per item" in c.to_markdown()


def test_too_few_rounds_is_an_error_not_a_silent_verdict():
    with pytest.raises(ValueError, match="at least 8"):
        compare({"a": busy(0.001), "b": busy(0.003)}, baseline="a", budget=Budget(min_rounds=5), device="cpu")


def test_comparison_renders_table_markdown_and_plot():
    c = compare(
        {"a": busy(0.0005), "b": busy(0.0005)},
        baseline="a",
        budget=Budget(min_rounds=10, min_run_time=0.02),
        device="cpu",
    )
    assert isinstance(c, Comparison)
    md = c.to_markdown()
    assert "| a |" in md and "| b |" in md and "baseline" in md
    html, metadata = c._repr_html_()
    assert "<table>" in html and metadata["tricks_lib"]["comparison"] == c.label
    assert c.names == ("a", "b")
    import matplotlib

    matplotlib.use("Agg")
    ax = c.plot()
    assert len(ax.patches) == 2
    with pytest.raises(KeyError, match="no variant"):
        c["missing"]


def test_compare_with_memory_column():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    c = compare(
        {"fwd": lambda: lin(x)},
        baseline="fwd",
        memory=True,
        budget=Budget(min_rounds=10, min_run_time=0.01),
        device="cpu",
    )
    assert c["fwd"].memory is not None
    assert "saved for backward" in c.to_markdown()


def testmedian_interval():
    assert median_interval([1.0, 2.0, 3.0], 0.99) is None  # too few values for 99%
    lo, hi = median_interval([float(i) for i in range(1, 31)], 0.99)
    assert lo < 15.5 < hi
    assert lo >= 1 and hi <= 30


def test_time_first_call_and_format():
    assert time_first_call(busy(0.001), device="cpu") >= 0.001
    assert format_seconds(0.00123) == "1.23 ms"
    assert format_seconds(2.5) == "2.5 s"
    assert format_seconds(3e-6) == "3 us"
    assert format_seconds(5e-9) == "5 ns"
    assert format_seconds(1289) == "21.5 min" and format_seconds(40000) == "11.1 h"  # not "1.29e+03 s"


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: measure(42), TypeError, "callable"),
        (lambda: measure(lambda: None, items=0), ValueError, "positive"),
        (lambda: measure(lambda: None, min_run_time=-1), ValueError, "positive"),
        (lambda: measure(lambda: None, warmup=-1), ValueError, "0 or more"),
        (lambda: measure(lambda: None, device="tpu"), ValueError, "device"),
        (lambda: compare({}, baseline="a"), ValueError, "empty"),
        (lambda: compare([lambda: None], baseline="a"), TypeError, "dict"),
        (lambda: compare({"a": 1}, baseline="a"), TypeError, "callable"),
        (lambda: compare({"a": lambda: None}, baseline="b"), ValueError, "baseline 'b'"),
        (lambda: compare({"a": lambda: None}, baseline="a", budget=Budget(min_run_time=0)), ValueError, "positive"),
        (lambda: compare({"a": lambda: None}, baseline="a", items={"zz": 3}), ValueError, "unknown"),
        (
            lambda: compare({"a": lambda: None}, baseline="a", budget=Budget(min_rounds=9, max_rounds=8)),
            ValueError,
            "max_rounds",
        ),
        (lambda: compare({"a": lambda: None}, baseline="a", budget=Budget(min_effect=2)), ValueError, "min_effect"),
        (lambda: time_first_call(None), TypeError, "callable"),
        (lambda: measure(lambda: None, min_blocks=0), ValueError, "positive"),
        (lambda: measure(lambda: None, progress=1), TypeError, "True or False"),
        (lambda: compare({"a": lambda: None}, baseline="a", more_work={"a": "zz"}), ValueError, "more_work"),
        (lambda: compare({"a": lambda: None}, baseline="a", more_work={"a": "a"}), ValueError, "itself"),
        (lambda: compare({"a": lambda: None}, baseline="a", more_work=["a"]), TypeError, "more_work"),
        (lambda: compare({"a": lambda: None}, baseline="a", budget=Budget(order_seed=-1)), ValueError, "0 or more"),
        (lambda: compare({"a": lambda: None}, baseline="a", memory="yes"), TypeError, "True or False"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_measurement_rejects_bad_times():
    with pytest.raises(ValueError, match="at least one"):
        Measurement(label="x", times=(), number_per_block=1, device="cpu", num_threads=1)
    with pytest.raises(ValueError, match="non-negative"):
        Measurement(label="x", times=(-1.0,), number_per_block=1, device="cpu", num_threads=1)
    with pytest.raises(ValueError, match="non-negative"):
        Measurement(label="x", times=(math.nan,), number_per_block=1, device="cpu", num_threads=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_timed_block_is_bracketed_by_cuda_syncs(monkeypatch):
    import tricks_lib.timing as bench

    syncs = []
    real_sync = torch.cuda.synchronize
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda device=None: (syncs.append(1), real_sync(device)))
    a = torch.randn(256, 256, device="cuda")
    c = compare(
        {"mm": lambda: a @ a},
        baseline="mm",
        budget=Budget(number=1, warmup=0, min_rounds=8, max_rounds=8),
        device="cuda",
    )
    assert c.rounds == 8
    assert len(syncs) >= 2 * 8  # a clock read before and after each block, each one synchronized


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_counts_gpu_time_not_launch_time():
    # torch.cuda._sleep spins the GPU for a number of cycles; launching it takes microseconds.
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 0.002)  # about 2 ms of spinning
    m = measure(lambda: torch.cuda._sleep(cycles), device="cuda", min_run_time=0.1)
    assert m.median > 0.001


def test_progress_bars_can_be_switched_off_for_headless_runs(monkeypatch):
    from tricks_lib.progress import optional_progress_bar

    monkeypatch.delenv("TRICKS_PROGRESS", raising=False)
    bar = optional_progress_bar(True, 3, "x")
    assert bar is not None
    bar.close()
    monkeypatch.setenv("TRICKS_PROGRESS", "0")
    assert optional_progress_bar(True, 3, "x") is None
    assert optional_progress_bar(False, 3, "x") is None


def replicate_clock(monkeypatch, cost_by_replicate):
    """A fake clock whose per-call cost depends on the replicate: state that a builder draws afresh.

    Returns a builder for compare(); each call starts the next replicate."""
    import tricks_lib.comparing as bench

    state = {"replicate": -1}

    def run_block(timer, number):
        return number * cost_by_replicate[timer._task_spec.label][state["replicate"]]

    def build():
        state["replicate"] += 1
        return {name: (lambda: None) for name in cost_by_replicate}

    monkeypatch.setattr(bench, "run_block", run_block)
    monkeypatch.setattr(bench, "_calibrate", lambda timer, target: 1)
    return build, state


def test_a_difference_that_one_fresh_replicate_does_not_show_is_not_significant(monkeypatch):
    # Three of four builds put "b" somewhere slow (1.3x), one somewhere fast (0.8x): the pooled
    # interval of all rounds clears 5% (three quarters of the rounds say slower), yet a rerun can
    # draw the fast state. Without replicates the same rounds read as a reproducible slowdown.
    costs = {"a": [1e-3] * 4, "b": [1.3e-3, 1.3e-3, 0.8e-3, 1.3e-3]}
    build, state = replicate_clock(monkeypatch, costs)
    c = compare(build, baseline="a", replicates=4, budget=Budget(warmup=0, min_rounds=40, max_rounds=40), device="cpu")
    row = c["b"]
    assert state["replicate"] == 3 and c.replicate_rounds == (10, 10, 10, 10) and c.rounds == 40
    slow = round(1 / 1.3, 3)
    assert [round(s, 3) for s in row.replicate_speedups] == [slow, slow, 1.25, slow]
    assert row.pooled_significant and not row.significant and row.not_reproduced
    assert row.verdict.startswith("not significant (fresh replicates disagree: 0.77x, 0.77x, 1.25x, 0.77x")
    assert row.to_dict()["replicate_speedups"] == list(row.replicate_speedups)
    assert "each of 4 replicates" in c.to_markdown()
    # The same blocks with no replicate structure: the pooled interval alone calls it slower.
    pooled = c.versus("b", "a")
    assert pooled.not_reproduced and not pooled.significant


def test_a_difference_every_fresh_replicate_shows_stays_significant(monkeypatch):
    costs = {"a": [1e-3, 1e-3, 1e-3], "b": [2e-3, 1.8e-3, 2.2e-3]}
    build, _ = replicate_clock(monkeypatch, costs)
    c = compare(build, baseline="a", replicates=3, budget=Budget(warmup=0, min_rounds=24, max_rounds=24), device="cpu")
    assert c["b"].significant and c["b"].verdict == "2.00x slower"
    assert c.versus("a", "b").significant and c.versus("a", "b").speedup == pytest.approx(2.0)
    assert c["a"].replicate_speedups == ()  # the baseline has nothing to agree with


def test_each_replicate_runs_on_freshly_built_variants(monkeypatch):
    built = []

    def build():
        calls = []
        built.append(calls)
        return {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}

    fake_clock(monkeypatch, {"a": 1e-3, "b": 1e-3})
    compare(
        build, baseline="a", replicates=3, budget=Budget(warmup=1, min_rounds=9, max_rounds=9, number=1), device="cpu"
    )
    assert len(built) == 3 and all(sorted(set(calls)) == ["a", "b"] for calls in built)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: compare({"a": lambda: None}, baseline="a", replicates=2), TypeError, "builds the dict"),
        (lambda: compare(lambda: {"a": lambda: None}, baseline="a", replicates=0), ValueError, "positive"),
        (lambda: compare(lambda: {"a": lambda: None}, baseline="a", replicates=True), TypeError, "replicates"),
        (
            lambda: compare(lambda: {"a": lambda: None}, baseline="a", replicates=16, budget=Budget(min_rounds=15)),
            ValueError,
            "cannot exceed min_rounds",
        ),
        (lambda: compare(lambda: [1], baseline="a"), TypeError, "function that builds one"),
    ],
)
def test_bad_replicate_arguments_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_builder_that_changes_its_variants_is_an_error(monkeypatch):
    fake_clock(monkeypatch, {"a": 1e-3, "b": 1e-3, "c": 1e-3})
    names = iter([["a", "b"], ["a", "c"]])
    with pytest.raises(ValueError, match="same variants"):
        compare(
            lambda: {n: (lambda: None) for n in next(names)},
            baseline="a",
            replicates=2,
            budget=Budget(min_rounds=8, max_rounds=8, number=1, warmup=0),
            device="cpu",
        )


class FakeClock:
    """A clock that only the workload moves: the harness's arithmetic can be checked exactly."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def costs(self, *seconds):
        """A workload whose calls take these seconds in turn (cycling)."""
        calls = iter(range(10**9))

        def work():
            self.now += seconds[next(calls) % len(seconds)]

        return work


def test_measure_reads_block_times_exactly_from_its_clock():
    clock = FakeClock()
    m = measure(clock.costs(2e-3), clock=clock, min_run_time=0.05, device="cpu", items=4)
    assert m.median == pytest.approx(2e-3) and m.iqr == pytest.approx(0, abs=1e-12)
    assert m.items_per_second == pytest.approx(4 / 2e-3) and len(m.times) >= 3
    # Per-call time is the block's time divided by its calls: alternating 1 ms / 3 ms calls average 2 ms
    # in every block of an even number of calls.
    alternating = measure(clock.costs(1e-3, 3e-3), clock=clock, min_run_time=0.05, device="cpu")
    assert alternating.median == pytest.approx(2e-3, rel=0.02)
    with pytest.raises(TypeError, match="clock"):
        measure(lambda: None, clock=1.0)


def test_compare_checks_that_variants_agree_before_timing():
    x = torch.randn(64, 64)
    same = {"matmul": lambda: x @ x, "mm": lambda: torch.mm(x, x)}
    cmp = compare(
        same, baseline="matmul", budget=Budget(min_rounds=8, min_run_time=0.01), check=torch.testing.assert_close
    )
    assert set(cmp.names) == {"matmul", "mm"}
    timed = []
    wrong = {"matmul": lambda: x @ x, "transposed": lambda: timed.append(1) or x.T @ x}
    with pytest.raises(ValueError, match="'transposed' does not return what 'matmul' returns.*AssertionError"):
        compare(
            wrong, baseline="matmul", budget=Budget(min_rounds=8, min_run_time=0.01), check=torch.testing.assert_close
        )
    assert timed == [1]  # called once for the check, never timed
    with pytest.raises(TypeError, match="check"):
        compare(same, baseline="matmul", budget=Budget(min_rounds=8), check="assert_close")


def test_compare_takes_a_check_per_variant_each_with_its_own_tolerance():
    from functools import partial

    x = torch.randn(64, 64)
    variants = {"fp32": lambda: x @ x, "bf16": lambda: (x.bfloat16() @ x.bfloat16()).float(), "mm": lambda: x.mm(x)}
    budget = Budget(min_rounds=8, min_run_time=0.01)
    exact = partial(torch.testing.assert_close, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'bf16' does not return"):  # one tolerance for all: bf16 fails it
        compare(variants, baseline="fp32", budget=budget, check=exact)
    lossy = partial(torch.testing.assert_close, rtol=0.05, atol=0.5)
    cmp = compare(variants, baseline="fp32", budget=budget, check={"bf16": lossy, "mm": exact})
    assert set(cmp.names) == {"fp32", "bf16", "mm"}
    with pytest.raises(ValueError, match=r"missing \['mm'\]"):
        compare(variants, baseline="fp32", budget=budget, check={"bf16": lossy})
    with pytest.raises(ValueError, match=r"unknown \['fp16'\]"):
        compare(variants, baseline="fp32", budget=budget, check={"bf16": lossy, "mm": exact, "fp16": exact})
    with pytest.raises(TypeError, match=r"check\['mm'\]"):
        compare(variants, baseline="fp32", budget=budget, check={"bf16": lossy, "mm": "exact"})


def test_default_budget_gives_a_slow_call_more_rounds_than_the_floor():
    # Each call (~4 ms) outlasts a block (0.05 s / 30), so 15 rounds already exceed the 0.05 s budget:
    # the fixed default stopped there. The adaptive default goes on while 30 rounds (0.12 s per variant)
    # fit in 4x the budget (0.2 s; the margin absorbs a loaded machine's overhead).
    c = compare(
        {"a": lambda: time.sleep(0.004), "b": lambda: time.sleep(0.004)},
        baseline="a",
        budget=Budget(min_run_time=0.05, warmup=0),
        device="cpu",
    )
    per_round = sum(row.measurement.median for row in c.rows)
    if 30 * per_round > 4 * 0.05 * 2:  # sleeps stretched past 6.7 ms: the cap rightly stops earlier
        pytest.skip(f"this machine stretched 4 ms sleeps to {per_round / 2 * 1e3:.1f} ms")
    assert c.rounds == 30, c.rounds


def test_an_explicit_min_rounds_is_not_extended():
    c = compare(
        {"a": busy(0.003), "b": busy(0.003)},
        baseline="a",
        budget=Budget(min_rounds=15, min_run_time=0.02),
        device="cpu",
    )
    assert c.rounds == 15, c.rounds


def test_a_call_too_slow_for_thirty_rounds_in_the_cap_stays_at_the_floor():
    # 30 rounds of 2 x 10 ms would be 0.6 s, past 4 x 0.02 s x 2 variants: the floor of 15 holds.
    c = compare(
        {"a": busy(0.01), "b": busy(0.01)}, baseline="a", budget=Budget(min_run_time=0.02, warmup=0), device="cpu"
    )
    assert c.rounds == 15, c.rounds


def test_progress_bar_passes_every_item_through_and_draws_nothing_when_turned_off(monkeypatch, capsys):
    from tricks_lib.progress import progress_bar

    monkeypatch.setenv("TRICKS_PROGRESS", "0")
    assert list(progress_bar(range(5), desc="five")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TRICKS_PROGRESS", "1")
    assert list(progress_bar(iter("abc"), desc="three", total=3)) == ["a", "b", "c"]
    assert "three" in capsys.readouterr().err  # text bar (no ipywidgets here), no IProgress warning
    with pytest.raises(TypeError, match="desc"):
        progress_bar(range(2), desc=3)


def test_compare_takes_its_budget_as_one_value():
    import inspect

    import pytest

    # The arguments a reader passes, and the budget knobs as one frozen value.
    assert len(inspect.signature(compare).parameters) <= 12
    with pytest.raises(TypeError, match="budget must be a tricks_lib.Budget"):
        compare({"a": lambda: None}, baseline="a", budget={"min_rounds": 8})
    with pytest.raises(ValueError, match="min_rounds must be at least 8"):
        Budget(min_rounds=3)
    with pytest.raises(ValueError, match="max_rounds"):
        Budget(min_rounds=20, max_rounds=10)
    assert Budget().rounds_at_least == 15 and Budget().rounds_target == 30
    assert Budget(min_rounds=9).rounds_target == 9  # an explicit value is used as given
