"""tricks_lib.profiling.phases and phase_shifts: phase_split's two readings on known durations, phase_shift, errors."""

import itertools
import time

import pytest
import torch

from tricks_lib.profiling.phase_shifts import PhaseShift, phase_shift
from tricks_lib.profiling.phases import WAIT_PHASE, PhaseSplit, phase_split
from tricks_lib.report.results import record

# A loader taking 20 ms per batch; a step of copy 5 ms, forward 10 ms, backward 15 ms.
DURATIONS = {WAIT_PHASE: 0.02, "copy": 0.005, "forward": 0.01, "backward": 0.015}
SHARE_TOLERANCE = 0.1  # sleeps overshoot on a busy machine: shares within 10 percentage points
AGREEMENT_TOLERANCE = 0.01  # timers and profiler ranges watch the same run: within 1 percentage point


def sleepy_loader(n, seconds=DURATIONS[WAIT_PHASE]):
    for i in range(n):
        time.sleep(seconds)
        yield i


def sleeping(seconds, result=None):
    def phase(value):
        time.sleep(seconds)
        return value if result is None else result(value)

    return phase


def known_phases(seen):
    return {
        "copy": sleeping(DURATIONS["copy"], lambda b: ("moved", b)),
        "forward": sleeping(DURATIONS["forward"], lambda moved: (seen.append(moved), "loss")[1]),
        "backward": sleeping(DURATIONS["backward"]),
    }


def test_phase_split_measures_known_durations_two_ways():
    seen = []
    split = phase_split(sleepy_loader(6), known_phases(seen), steps=5, device="cpu", items_per_step=4)
    assert seen == [("moved", i) for i in range(6)]  # each phase got the previous one's result, in order
    assert split.phases == (WAIT_PHASE, "copy", "forward", "backward") and split.steps == 5
    expected = {name: s / sum(DURATIONS.values()) for name, s in DURATIONS.items()}
    for name, row in zip(split.phases, split.timer_times):
        assert min(row) >= DURATIONS[name]  # a sleep never ends early
        assert split.timer_shares[name] == pytest.approx(expected[name], abs=SHARE_TOLERANCE)
        assert split.profiler_shares[name] == pytest.approx(expected[name], abs=SHARE_TOLERANCE)
    assert split.least_margin_s >= -1e-6  # each profiler range holds its timer interval: never shorter
    assert split.disagreement <= AGREEMENT_TOLERANCE and split.worst_disagreement <= SHARE_TOLERANCE
    assert max(abs(d) for d in split.disagreements.values()) <= SHARE_TOLERANCE
    assert split.dominant == WAIT_PHASE and split.bound == "compute-bound"  # 20 of 50 ms waiting
    assert sum(split.timer_s.values()) + split.unmarked_s == pytest.approx(split.total_s)
    assert split.items_per_second == pytest.approx(4 / split.step_s)


def test_the_readings_are_independent_clocks(monkeypatch):
    # A timer that gains 10 ms per read bills 10 ms too much to each phase: the profiler must disagree.
    reads = itertools.count()
    monkeypatch.setattr(
        "tricks_lib.profiling.phases._synced_timer", lambda device: lambda: time.perf_counter() + 0.01 * next(reads)
    )
    split = phase_split(sleepy_loader(4), known_phases([]), steps=3, device="cpu")
    assert split.disagreement > 0.05 and split.least_margin_s < -0.005


def test_warmup_steps_are_left_out_of_both_readings():
    def slow_first_step(batch, phase):
        with phase("compute"):
            time.sleep(0.2 if batch == 0 else 0.01)

    split = phase_split(sleepy_loader(4, 0.0), slow_first_step, steps=3, device="cpu", warmup=1)
    assert max(split.timer_times[1]) < 0.1
    assert split.profiler_s["compute"] < 0.1  # the profiler's window opens after the warm-up step
    assert all(t > 0 for t in split.profiler_times[1])  # one range per timed step, each in its own step


def test_step_function_marks_its_own_phases():
    def step(batch, phase):
        with phase("forward"):
            time.sleep(0.005)
        time.sleep(0.01)  # in no phase: unmarked
        with phase("forward"):  # a name used twice in a step adds up
            time.sleep(0.005)
        if batch % 2:
            with phase("logging"):  # a phase some steps skip: 0 s in those
                time.sleep(0.002)

    split = phase_split(sleepy_loader(5, 0.0), step, steps=4, device="cpu", warmup=0)
    assert split.phases == (WAIT_PHASE, "forward", "logging")
    assert min(split.timer_times[1]) >= 0.01
    assert [t > 0 for t in split.timer_times[2]] == [False, True, False, True]
    assert [t > 0 for t in split.profiler_times[2]] == [False, True, False, True]  # ranges found in their steps
    assert min(split.profiler_times[1]) >= 0.01  # both "forward" ranges of a step add up
    assert split.unmarked_s >= 4 * 0.01


def nested_phases(batch, phase):
    with phase("outer"), phase("inner"):
        pass


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [(None, ValueError, "cannot nest"), (WAIT_PHASE, ValueError, "own range"), ("", TypeError, "non-empty string")],
)
def test_bad_phase_use_raises(name, error, match):
    def step(batch, phase):
        with phase(name):
            pass

    with pytest.raises(error, match=match):
        phase_split(range(3), nested_phases if name is None else step, steps=1, device="cpu")
    assert phase_split(range(2), {"s": lambda b: b}, steps=1, device="cpu").steps == 1  # the profiler was stopped


def test_phase_split_renders_and_records():
    split = phase_split(sleepy_loader(3, 0.002), {"step": sleeping(0.002)}, steps=2, device="cpu", label="tiny")
    assert "tiny" in repr(split) and "share (profiler)" in split._repr_markdown_()
    assert "<table>" in split._repr_html_()
    rec = record("tiny split", split)
    assert rec.kind == PhaseSplit.record_kind == "phase split"
    assert [row["variant"] for row in rec.summary] == [f"tiny: {WAIT_PHASE}", "tiny: step"]
    assert split.to_dict()["steps"] == 2 and set(split.to_dict()["profiler_s"]) == {WAIT_PHASE, "step"}


def test_progress_bar_counts_every_step(monkeypatch):
    updates = []

    class Bar:
        def update(self):
            updates.append(1)

        def close(self):
            updates.append("closed")

    monkeypatch.setattr(
        "tricks_lib.profiling.phases._progress_bar", lambda enabled, total, desc: Bar() if enabled else None
    )
    phase_split(range(4), {"step": lambda b: b}, steps=3, device="cpu", progress=True)
    assert updates == [1, 1, 1, 1, "closed"]  # the warm-up step too, then closed


def test_phase_split_says_when_the_loader_runs_out():
    with pytest.raises(ValueError, match="yielded 3 batches"):
        phase_split(range(3), {"step": lambda b: None}, steps=5, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"loader": 3}, TypeError),
        ({"phases": "not callable"}, TypeError),
        ({"phases": {}}, ValueError),
        ({"phases": {"forward": 3}}, TypeError),
        ({"phases": {"": lambda b: b}}, TypeError),
        ({"steps": 0}, ValueError),
        ({"steps": 2.0}, TypeError),
        ({"steps": True}, TypeError),
        ({"warmup": -1}, ValueError),
        ({"device": "tpu"}, ValueError),
        ({"label": ""}, TypeError),
        ({"items_per_step": 0}, ValueError),
        ({"progress": 1}, TypeError),
    ],
)
def test_phase_split_rejects_bad_arguments(kwargs, error):
    args = {"loader": range(10), "phases": {"step": lambda b: None}, "steps": 2, **kwargs}
    loader, phases = args.pop("loader"), args.pop("phases")
    with pytest.raises(error):
        phase_split(loader, phases, **args)


def made_split(label, seconds, profiler=None):
    """A PhaseSplit of one step with the given seconds per phase (no timing: for phase_shift)."""
    names = (WAIT_PHASE, *seconds)
    times = (0.5, *seconds.values())
    profiler = profiler or times
    return PhaseSplit(label, names, tuple((t,) for t in times), tuple((t,) for t in profiler), sum(times), "cpu")


def test_disagreement_is_the_median_steps():
    # Three steps; the profiler saw 0.3 s more wait in the second one only (a preempted clock read).
    timers = ((0.1, 0.1, 0.1), (0.1, 0.1, 0.1))
    profiler = ((0.1, 0.4, 0.1), (0.1, 0.1, 0.1))
    split = PhaseSplit("x", (WAIT_PHASE, "step"), timers, profiler, 0.6, "cpu")
    assert split.step_disagreements == pytest.approx((0.0, 0.8 - 0.5, 0.0))
    assert split.disagreement == 0.0 and split.worst_disagreement == pytest.approx(0.3)
    assert split.disagreements[WAIT_PHASE] == pytest.approx(0.5 - 0.6 / 0.9)  # over all steps: the outlier counts
    assert split.least_margin_s == pytest.approx(0.0)


def test_phase_shift_finds_what_moved():
    before = made_split("0 workers", {"forward": 0.25, "backward": 0.25})  # wait 50%
    times = tuple((t,) for t in (0.05, 0.25, 0.25, 0.0))  # the wait shrinks; a new phase that takes no time
    after = PhaseSplit("2 workers", (WAIT_PHASE, "forward", "backward", "optimizer"), times, times, 0.55, "cpu")
    shift = phase_shift(before, after, change="workers")
    assert shift.largest == WAIT_PHASE and shift.changes[WAIT_PHASE] == pytest.approx(0.05 / 0.55 - 0.5)
    assert shift.moved == {WAIT_PHASE: True, "forward": True, "backward": True, "optimizer": False}
    assert "moved" in shift.verdict and "loader-bound -> compute-bound" not in shift.verdict  # 50% is not > 50%
    assert "items/s" not in shift.verdict  # no items_per_step given: no rate to compare
    assert "did not move" not in shift.verdict and "<table>" in shift._repr_html_()
    assert "change over 5.0 pt" in shift._repr_markdown_() and isinstance(shift, PhaseShift)
    focused = phase_shift(before, after, change="workers", focus="optimizer")
    assert focused.verdict.startswith("optimizer 0% -> 0%") and "did not move" in focused.verdict


def test_phase_shift_compares_items_per_second():
    before = made_split("batch 16", {"step": 0.5})  # 1 s per step
    after = PhaseSplit("batch 64", before.phases, ((0.5,), (1.5,)), ((0.5,), (1.5,)), 2.0, "cpu", items_per_step=64)
    before = PhaseSplit(
        "batch 16", before.phases, before.timer_times, before.profiler_times, 1.0, "cpu", items_per_step=16
    )
    assert after.items_per_second == 32 and before.items_per_second == 16
    assert "items/s 2.00x" in phase_shift(before, after, change="batch 16 -> 64").verdict


def test_phase_shift_threshold_includes_the_splits_own_disagreement():
    before = made_split("a", {"forward": 0.5})
    after = made_split("b", {"forward": 0.55}, profiler=(0.5, 0.45))  # the readings disagree by ~5 pt
    shift = phase_shift(before, after, change="nothing much", tolerance=0.01)
    assert shift.threshold == pytest.approx(after.disagreement) and shift.threshold > 0.01
    assert not any(shift.moved.values()) and "did not move" in shift.verdict


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"before": "split"}, TypeError),
        ({"change": ""}, TypeError),
        ({"tolerance": "5%"}, TypeError),
        ({"tolerance": 0}, ValueError),
        ({"tolerance": 5}, ValueError),
        ({"focus": 3}, TypeError),
        ({"focus": "loss"}, ValueError),
    ],
)
def test_phase_shift_rejects_bad_arguments(kwargs, error):
    split = made_split("a", {"forward": 0.5})
    args = {"before": split, "after": split, "change": "x", **kwargs}
    with pytest.raises(error):
        phase_shift(args.pop("before"), args.pop("after"), **args)


def test_phase_split_result_checks_its_fields():
    one = ((0.1,),)
    with pytest.raises(ValueError):
        PhaseSplit("x", ("forward",), one, one, 1.0, "cpu")  # no wait phase first
    with pytest.raises(ValueError):
        PhaseSplit("x", (WAIT_PHASE,), ((),), ((),), 1.0, "cpu")  # no steps
    with pytest.raises(ValueError):
        PhaseSplit("x", (WAIT_PHASE, "f"), ((0.1,), (0.1, 0.2)), ((0.1,), (0.1,)), 1.0, "cpu")  # ragged
    with pytest.raises(ValueError):
        PhaseSplit("x", (WAIT_PHASE,), one, ((0.1, 0.2),), 1.0, "cpu")  # readings of different lengths
    with pytest.raises(ValueError):
        PhaseSplit("x", (WAIT_PHASE,), one, one, 0.0, "cpu")


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: checks that each phase's GPU work is billed to it"
)
def test_queued_gpu_work_is_billed_to_its_phase():
    a = torch.randn(4096, 4096, device="cuda")

    def step(batch, phase):
        with phase("matmuls"):
            for _ in range(20):
                a @ a  # queued: returns before the GPU is done
        with phase("nothing"):
            pass

    split = phase_split(range(4), step, steps=3, device="cuda")
    assert split.timer_s["matmuls"] > 50 * split.timer_s["nothing"]
    assert split.disagreement <= AGREEMENT_TOLERANCE
