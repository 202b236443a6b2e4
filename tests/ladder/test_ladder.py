import dataclasses

import pytest
import torch

from tricks_lib.ladder.config import LadderConfig, TargetTrace, TrainingRun
from tricks_lib.ladder.images import ImageData, augment_batch
from tricks_lib.ladder.results import Ladder, Rung, RungResult
from tricks_lib.ladder.run import _cumulative, _pipeline_step, run_ladder, run_to_target, train_to_target
from tricks_lib.measurements import Comparison, Measurement, paired_row
from tricks_lib.outcome import Outcome


def fake_run(accuracies, target, seconds_per_epoch=1.0, seed=0):
    calls = []
    sequence = iter(accuracies)
    trace = run_to_target(calls.append, lambda: next(sequence), epochs=len(accuracies), target=target, device="cpu")
    return trace, calls


def test_stops_at_the_first_evaluation_at_or_above_the_target():
    trace, calls = fake_run([0.2, 0.5, 0.8, 0.9, 0.95], target=0.8)
    assert calls == [0, 1, 2]  # three epochs trained, then stopped
    assert trace.accuracies == (0.2, 0.5, 0.8)  # 0.8 counts: "at or above"
    assert trace.epochs_to_target == 3
    assert trace.time_to_target == trace.elapsed[2]
    assert list(trace.elapsed) == sorted(trace.elapsed)


def test_never_reaching_the_target_runs_the_whole_schedule():
    trace, calls = fake_run([0.2, 0.5, 0.7], target=0.8)
    assert calls == [0, 1, 2]
    assert trace.epochs_to_target is None and trace.time_to_target is None


def test_without_stopping_the_first_time_at_the_target_is_kept():
    calls, seq = [], iter([0.1, 0.9, 0.3, 0.95])
    trace = run_to_target(calls.append, lambda: next(seq), epochs=4, target=0.85, stop_at_target=False,
                          setup_seconds=5.0, device="cpu")  # fmt: skip
    assert calls == [0, 1, 2, 3]
    assert trace.epochs_to_target == 2
    assert trace.elapsed[0] >= 5.0  # setup counts in the time to target


def tiny_data(n_train=64, n_test=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n_train + n_test, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n_train + n_test,), generator=g)
    return ImageData(
        "random", images[:n_train], labels[:n_train], images[n_train:], labels[n_train:], tuple("abcdefghij")
    )


def plain_step(config, model, total_steps, device):
    """The capstone notebook's step, cut to what these tests need: layout, optimizer implementation, smoothing."""
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, nesterov=True,
                          foreach=config.optimizer_impl == "foreach", fused=config.optimizer_impl == "fused")  # fmt: skip

    def step(x, y, i):
        if config.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=config.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


TINY = LadderConfig(width=0.0625, epochs=1, target=1.0, batch_size=16, base_batch_size=16, eval_batch_size=32,
                    on_device_data=True)  # fmt: skip


def test_a_rung_is_the_same_training_function_with_one_option_changed():
    data = tiny_data()
    base = train_to_target(TINY, data, plain_step, seed=3, device="cpu", stop_at_target=False)
    again = train_to_target(TINY, data, plain_step, seed=3, device="cpu", stop_at_target=False)
    foreach = train_to_target(dataclasses.replace(TINY, optimizer_impl="foreach"), data, plain_step, seed=3,
                              device="cpu", stop_at_target=False)  # fmt: skip
    smoothed = train_to_target(dataclasses.replace(TINY, label_smoothing=0.2), data, plain_step, seed=3,
                               device="cpu", stop_at_target=False)  # fmt: skip
    assert base.trace.accuracies == again.trace.accuracies  # seeded: the same run twice
    assert foreach.trace.accuracies == base.trace.accuracies  # same math, another optimizer implementation
    assert foreach.saved_bytes == base.saved_bytes
    assert smoothed.saved_bytes == base.saved_bytes and len(smoothed.trace.accuracies) == TINY.epochs
    assert base.compile_seconds is None and base.images_per_second > 0


def test_rungs_stack_one_change_at_a_time_and_skipped_rungs_change_nothing():
    rungs = [Rung("baseline"), Rung("+ cl", {"channels_last": True}), Rung("+ fp16", {"autocast_dtype": torch.float16},
             skip_reason="CUDA only"), Rung("+ smoothing", {"label_smoothing": 0.2})]  # fmt: skip
    configs = _cumulative(TINY, rungs)
    assert configs[0] == TINY and configs[2] is None
    assert configs[1] == dataclasses.replace(TINY, channels_last=True)
    assert configs[3] == dataclasses.replace(TINY, channels_last=True, label_smoothing=0.2)
    with pytest.raises(ValueError):
        Rung("typo", {"chanels_last": True})


def fake_result(name, times, target=0.9, compile_seconds=None):
    runs = tuple(
        TrainingRun(
            seed=i,
            trace=TargetTrace((0.95 if t else 0.5,), (t or 9.0,), (1.0,), target),
            images_per_second=100.0,
            compile_seconds=compile_seconds,
            setup_seconds=0.0,
            peak_memory_bytes=None,
            saved_bytes=1,
        )  # fmt: skip
        for i, t in enumerate(times)
    )
    return RungResult(name, TINY, runs)


def test_verdicts_read_the_seeds_spread():
    ladder = Ladder(
        (fake_result("a", [10.0, 11.0]), fake_result("b", [5.0, 6.0]), fake_result("c", [5.5, 6.5]),
         RungResult("skip", None, (), "CUDA only"), fake_result("d", [4.0, None]), fake_result("e", [8.0, 9.0])),
        "fake", "cpu", 0.9,
    )  # fmt: skip
    assert ladder.verdict("a") == "baseline"
    assert "faster" in ladder.verdict("b") and ladder.helped("b")
    assert ladder.verdict("c").startswith("no clear change")
    assert ladder.verdict("skip") == "skipped: CUDA only"
    assert ladder.verdict("d") == "missed the target in 1 of 2 seeds"
    assert ladder.previous("e").name == "d" and "did not" in ladder.verdict("e")
    assert "| a |" in ladder.to_markdown()


def test_a_rung_that_reused_the_compiled_graph_is_compared_without_the_compile():
    # In one process the rung after torch.compile reuses its graph (1 ms of compile instead of 15 s);
    # a reader's fresh process would pay it again, so the verdict compares training times only.
    ladder = Ladder(
        (fake_result("eager", [2.0, 2.1]), fake_result("compiled", [16.0, 17.0], compile_seconds=15.0),
         fake_result("smoothing", [1.0, 1.1], compile_seconds=0.001)),
        "fake", "cpu", 0.9,
    )  # fmt: skip
    assert "slower" in ladder.verdict("compiled")  # compile counted: the reader pays it once
    # After the compile: [1.0, 2.0] s before against [0.999, 1.099] s here: overlapping seeds, 1.43x.
    verdict = ladder.verdict("smoothing")
    assert verdict.startswith("no clear change (1.43x;") and "compile excluded on both sides" in verdict


def test_batched_augmentation_gives_flipped_shifted_copies():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 8, 8, generator=g)
    out = augment_batch(x, translate=1, generator=g)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    for i in range(16):
        views = [v for dy in range(3) for dx in range(3) for v in (padded[i, :, dy : dy + 8, dx : dx + 8],)]
        views += [v.flip(-1) for v in views]
        # flip first, then shift: the shifted crop of the flipped image
        flipped = torch.nn.functional.pad(x[i : i + 1].flip(-1), (1, 1, 1, 1), mode="reflect")[0]
        views += [flipped[:, dy : dy + 8, dx : dx + 8] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(out[i], v) for v in views)
    flips = augment_batch(x, translate=0, generator=g)
    assert all(torch.equal(flips[i], x[i]) or torch.equal(flips[i], x[i].flip(-1)) for i in range(16))
    assert not torch.equal(out, x)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        LadderConfig(optimizer_impl="adam")
    with pytest.raises(ValueError):
        LadderConfig(target=1.5)
    with pytest.raises(TypeError):
        LadderConfig(batch_size=64.0)


def test_run_ladder_keeps_rung_order_seeds_and_skips():
    rungs = [Rung("baseline"), Rung("+ gpu thing", {"channels_last": True}, skip_reason="CUDA only"),
             Rung("+ foreach", {"optimizer_impl": "foreach"})]  # fmt: skip
    ladder = run_ladder(TINY, rungs, tiny_data(), plain_step, seeds=(0, 1), device="cpu", step_budget=None)
    assert [r.name for r in ladder.rungs] == ["baseline", "+ gpu thing", "+ foreach"]
    assert ladder["+ gpu thing"].skipped and ladder["+ gpu thing"].runs == ()
    assert [run.seed for run in ladder["+ foreach"].runs] == [0, 1]
    assert not ladder["+ foreach"].config.channels_last  # the skipped rung's change is not stacked
    # the same math as the baseline, seed by seed
    for a, b in zip(ladder["baseline"].runs, ladder["+ foreach"].runs):
        assert a.trace.accuracies == b.trace.accuracies


def test_rung_adding_names_the_change_and_rejects_unknown_fields():
    assert Rung.adding(channels_last=True).name == "+ channels_last"
    assert Rung.adding(batch_size=128, warmup_fraction=0.23).name == "+ batch_size=128, warmup_fraction=0.23"
    bf16 = Rung.adding(autocast_dtype=torch.bfloat16, caveat="old CPUs", skip_reason="no")
    assert (bf16.name, bf16.changes, bf16.caveat, bf16.skip_reason) == (
        "+ autocast_dtype=bfloat16",
        {"autocast_dtype": torch.bfloat16},
        "old CPUs",
        "no",
    )
    with pytest.raises(ValueError):
        Rung.adding()
    with pytest.raises(ValueError):
        Rung.adding(chanels_last=True)


def test_unsupported_rungs_are_skipped_with_the_reason():
    from tricks_lib.ladder.run import _skip_reasons, unsupported_reason

    assert unsupported_reason({"autocast_dtype": torch.float16}, "cpu").startswith("CUDA only")
    assert unsupported_reason({"autocast_dtype": torch.bfloat16}, "cpu") is None  # CPU autocast's own type
    assert unsupported_reason({"channels_last": True}, "cpu") is None
    rungs = [
        Rung("baseline"),
        Rung.adding(autocast_dtype=torch.float16),
        Rung.adding(lookahead=True, skip_reason="off"),
    ]
    checked = _skip_reasons(rungs, torch.device("cpu"))
    assert [r.skip_reason for r in checked] == [None, unsupported_reason(rungs[1].changes, "cpu"), "off"]
    assert _skip_reasons(rungs, None) == rungs  # skip_unsupported=False: nothing decided for the caller


def test_reading_groups_rungs_and_reads_the_stack_at_its_fastest_rung_that_reached_the_target():
    ladder = Ladder(
        (fake_result("a", [10.0, 11.0]), fake_result("b", [5.0, 6.0]), fake_result("c", [5.5, 6.5]),
         RungResult("skip", None, (), "CUDA only"), fake_result("d", [12.0, 13.0]), fake_result("e", [4.0, None])),
        "fake", "cpu", 0.9,
    )  # fmt: skip
    reading = ladder.reading()
    assert reading.faster == ("b",) and reading.unclear == ("c",) and reading.slower == ("d",)
    assert reading.missed == ("e (1 of 2 seeds)",) and reading.skipped == ("skip (CUDA only)",)
    # not the top rung (e missed the target in a seed) but the least mean time of those that reached it in every seed
    assert reading.best == "b" and reading.stack == "1.91x faster to target than the baseline (no seed overlap)"
    assert reading.summary == (
        "least mean time to 90% of the rungs that reached it in every seed: b, 1.91x faster to target than the "
        "baseline (no seed overlap); "
        "missed it in some seed: e (1 of 2 seeds)"
    )
    assert "| clearly faster than the rung before | b |" in reading._repr_markdown_()
    only_slower = Ladder((fake_result("a", [1.0, 1.1]), fake_result("d", [2.0, 2.1])), "fake", "cpu", 0.9)
    assert only_slower.reading().best == "a" and "no rung reached the target sooner" in only_slower.reading().stack
    none = Ladder((fake_result("a", [1.0, None]),), "fake", "cpu", 0.9).reading()
    assert none.best is None and none.summary.startswith("no rung reached 90% in every seed")


def test_the_fastest_rung_counts_a_reused_compile_as_a_fresh_process_pays_it():
    ladder = Ladder(
        (fake_result("eager", [2.0, 2.1]), fake_result("compiled", [16.0, 17.0], compile_seconds=15.0),
         fake_result("smoothing", [1.0, 1.1], compile_seconds=0.001)),
        "fake", "cpu", 0.9,
    )  # fmt: skip
    assert ladder.fresh_times("smoothing") == pytest.approx((16.0, 16.1))  # the compile it reused, added back
    assert ladder.fresh_times("compiled") == (16.0, 17.0) and ladder.fresh_times("eager") == (2.0, 2.1)
    assert ladder.best() == "eager"  # 1.05 s after the compile is not what a reader's fresh process gets


def fake_epochs(name, epochs, seeds=None):
    runs = tuple(
        TrainingRun(
            seed=seed,
            trace=TargetTrace(
                (0.5,) * ((e or 3) - 1) + (0.95 if e else 0.5,), tuple(range(1, (e or 3) + 1)), (1.0,) * (e or 3), 0.9
            ),
            images_per_second=100.0,
            compile_seconds=None,
            setup_seconds=0.0,
            peak_memory_bytes=None,
            saved_bytes=1,
        )  # fmt: skip
        for seed, e in zip(seeds or range(len(epochs)), epochs)
    )
    return RungResult(name, TINY, runs)


def test_epochs_change_reads_seed_pairs_with_a_sign_test():
    ladder = Ladder(
        (fake_epochs("a", [2, 2, 3, 2, 2, 3]), fake_epochs("b", [3, 3, 4, 3, 3, None]),
         fake_epochs("c", [3, 2, 4, 4, 2, 3]), fake_epochs("d", [3, 3, 3, 3, 3]), fake_epochs("e", [3] * 5, [5] * 5)),
        "fake", "cpu", 0.9,
    )  # fmt: skip
    assert ladder["b"].epochs == (3, 3, 4, 3, 3, None)
    more = ladder.epochs_change("b")
    assert (more.reference, more.fewer, more.more, more.same) == ("a", 0, 6, 0)  # a miss counts as more
    assert more.p_value == pytest.approx(2 / 64) and more.direction == "more"
    assert more.verdict == "more epochs than a (fewer in 0, more in 6, same in 0 of 6 seeds; sign test p = 0.031)"
    mixed = ladder.epochs_change("c")  # against b: fewer in 3, same in 2, more in 1 (the seed b missed)
    assert (mixed.fewer, mixed.more, mixed.same) == (3, 1, 2) and mixed.p_value == pytest.approx(0.625)
    assert mixed.direction is None and mixed.verdict.startswith("no clear change in epochs (fewer in 3")
    five = ladder.epochs_change("c", "a")  # 5 of 6 seeds could; 5 seeds alone never can
    assert five.smallest_p == pytest.approx(2 / 64)
    assert ladder.epochs_change("a") is None
    with pytest.raises(ValueError):
        ladder.epochs_change("d")  # five seeds against six: they do not pair up
    with pytest.raises(ValueError):
        ladder.epochs_change("e", "d")  # the same count, other seeds


def test_compile_payback_counts_the_images_that_repay_the_cold_compile():
    def runs(ips, compile_s, epochs):
        return tuple(
            TrainingRun(
                i,
                TargetTrace((0.5,) * (epochs - 1) + (0.95,), tuple(range(1, epochs + 1)), (1.0,) * epochs, 0.9),
                ips,
                compile_s,
                0.0,
                None,
                1,
            )  # fmt: skip
            for i in range(2)
        )

    compiled_cfg = dataclasses.replace(TINY, compile=True)
    eager, compiled = (
        RungResult("eager", TINY, runs(100.0, None, 3)),
        RungResult("+ compile", compiled_cfg, runs(200.0, 10.0, 3)),
    )
    payback = Ladder((eager, compiled), "fake", "cpu", 0.9).compile_payback(images_per_epoch=500)
    # 1/100 - 1/200 = 5 ms saved per image: 10 s of compile is repaid after 2,000 images; one run trains 1,500
    assert payback.images_to_pay_back == pytest.approx(2000)
    assert payback.images_per_run == 1500 and payback.paid_back_within_a_run is False
    assert ["paid back within one run", "no"] in payback.rows()
    # With a paired step comparison, its speeds and verdict: a compiled step that is not significantly faster
    # never repays the compile, however its median compares.
    steps = fake_steps({"eager": (0.64, 0.64), "+ compile": (0.32, 0.33)}, items={"eager": 64, "+ compile": 64})
    paired = Ladder((eager, compiled), "fake", "cpu", 0.9, steps).compile_payback(500)
    assert paired.step_outcome is Outcome.FASTER and paired.eager_images_per_second == pytest.approx(100)
    assert paired.images_to_pay_back == pytest.approx(10 / (1 / 100 - 1 / 200), rel=0.05)
    assert ["compiled step against the eager one (paired)", paired.step_verdict] in paired.rows()
    unclear = fake_steps({"eager": (0.64, 0.64), "+ compile": (0.60, 0.70)}, items={"eager": 64, "+ compile": 64})
    payback = Ladder((eager, compiled), "fake", "cpu", 0.9, unclear).compile_payback(500)
    assert payback.step_outcome is Outcome.NOT_SIGNIFICANT and payback.images_to_pay_back is None
    slower = RungResult("+ compile", compiled_cfg, runs(50.0, 10.0, 3))
    assert Ladder((eager, slower), "fake", "cpu", 0.9).compile_payback(500).images_to_pay_back is None
    assert Ladder((eager,), "fake", "cpu", 0.9).compile_payback(500) is None
    with pytest.raises(TypeError):
        Ladder((eager,), "fake", "cpu", 0.9).compile_payback(500.0)


def test_image_data_counts_classes_and_the_majority_floor():
    data = ImageData("t", torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.tensor([0, 0, 1, 2]),
                     torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.tensor([1, 1, 1, 0]), ("x", "y", "z"))  # fmt: skip
    assert data.class_counts() == {"x": 2, "y": 1, "z": 1}
    assert data.class_counts("test") == {"x": 1, "y": 3, "z": 0}
    assert data.majority_share == 0.75 and "75.0%" in repr(data)
    with pytest.raises(ValueError):
        data.class_counts("val")


def fake_steps(per_call, items, rounds=20):
    """A Comparison of step times: name -> (first half's, second half's) seconds per call, rounds alternating."""
    measurements = {
        name: Measurement(name, tuple(a if i % 2 else b for i in range(rounds)), 1, "cpu", 1, items[name])
        for name, (a, b) in per_call.items()
    }
    base = next(iter(per_call))
    rows = tuple(
        paired_row(m, measurements[base], min_effect=0.05, scale=items[name], base_scale=items[base])
        for name, m in measurements.items()
    )
    return Comparison("steps", base, rows, rounds, "cpu", 1, 0.05, per_item=True)


def test_a_training_step_is_the_runs_step_from_mid_schedule_on_its_own_pipeline():
    data = tiny_data()
    for config in (TINY, dataclasses.replace(TINY, on_device_data=False, channels_last=True, whitening=True)):
        step = _pipeline_step(config, data, plain_step, seed=0, device="cpu")
        for _ in range(3 * len(data.train_labels) // config.batch_size + 1):  # over three epoch boundaries
            assert step() is None
    with pytest.raises(TypeError):
        _pipeline_step(TINY, "data", plain_step)


def test_run_ladder_times_each_rungs_step_against_the_baseline():
    from tricks_lib.comparing import Budget

    rungs = [Rung("baseline"), Rung.adding(channels_last=True)]
    ladder = run_ladder(TINY, rungs, tiny_data(), plain_step, seeds=(0,), device="cpu", warmup=False,
                        step_budget=Budget(min_run_time=0.01))  # fmt: skip
    assert ladder.steps.baseline == "baseline" and ladder.steps["+ channels_last"].speedup > 0
    assert ladder.steps["baseline"].measurement.items_per_second > 0  # items: the rung's batch size
    with pytest.raises(TypeError):
        run_ladder(TINY, rungs, tiny_data(), "not a step builder", device="cpu")
