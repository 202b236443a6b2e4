"""compare_environments / evaluate_in_environments / allocators: each worker process runs under its own environment."""

import pytest
from process_state import gone_within

from tricks_lib.inference.allocators import allocator_environments, find_shared_library, loaded_allocators
from tricks_lib.inference.env_compare import EnvironmentComparison, compare_environments
from tricks_lib.inference.env_workers import evaluate_in_environments

ENVS = {"a": {"TRICKS_ENV_PROBE": "a"}, "b": {"TRICKS_ENV_PROBE": "b"}}


@pytest.mark.slow
def test_each_environment_sees_its_variable():
    seen = evaluate_in_environments(
        "os.environ.get('TRICKS_ENV_PROBE')", {**ENVS, "unset": {"TRICKS_ENV_PROBE": None}}, setup="import os"
    )
    assert seen == {"a": "'a'", "b": "'b'", "unset": "None"}


@pytest.mark.slow
def test_compare_times_every_environment_and_fails_loudly():
    # The setup asserts the variable in each worker: a worker without its environment would fail.
    setup = "import os\nassert os.environ['TRICKS_ENV_PROBE'] == ENV_NAME\nvalues = list(range(100))"
    cmp = compare_environments(setup, "sum(values)", ENVS, baseline="a", rounds=8, block_seconds=0.002)
    assert cmp.names == ("a", "b") and cmp.rounds == 8
    assert all(len(r.measurement.times) == 8 and r.measurement.median > 0 for r in cmp.rows)
    assert cmp["a"].verdict == "baseline"
    with pytest.raises(RuntimeError, match="AssertionError"):
        compare_environments(setup, "pass", {"a": {"TRICKS_ENV_PROBE": "b"}}, baseline="a", rounds=8)


@pytest.mark.slow
def test_what_the_timed_code_prints_never_reads_as_a_timing():
    """A setup and a statement that print numbers (Python's print and the C library's stdout): the timings are
    the worker's own, far below the printed 1.75 s."""
    setup = "import ctypes, sys\nprint('1.75')\nlibc = ctypes.CDLL(None)"
    stmt = "print('1.75'); sys.stdout.flush(); libc.puts(b'1.75')"
    cmp = compare_environments(setup, stmt, ENVS, baseline="a", rounds=8, block_seconds=0.002)
    assert all(0 < t < 0.5 for r in cmp.rows for t in r.measurement.times)
    assert evaluate_in_environments("sum([1, 2])", ENVS, setup="print(99)") == {"a": "3", "b": "3"}


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="baseline"):
        compare_environments("", "pass", ENVS, baseline="c")
    with pytest.raises(ValueError, match="rounds"):
        compare_environments("", "pass", ENVS, baseline="a", rounds=3)
    with pytest.raises(TypeError):
        compare_environments("", "pass", {"a": {"X": 1}}, baseline="a")
    assert find_shared_library("libdefinitely-not-here.so.9") is None


def _comparison(num_threads, thread_counts):
    return EnvironmentComparison(
        label="sweep", baseline="a", rows=(), rounds=8, device="cpu", num_threads=num_threads, min_effect=0.03,
        thread_counts=thread_counts,
    )  # fmt: skip


def test_caption_gives_each_workers_threads():
    one = _comparison(1, (1, 1))._caption()
    assert "1 thread per worker" in one and "1 threads" not in one
    sweep = _comparison(1, (1, 2))._caption()
    assert "1/2 threads per worker" in sweep and ", 1 threads" not in sweep
    assert "2 threads per worker" in _comparison(2, (2,))._caption()


def test_allocator_environments_name_what_is_missing(monkeypatch):
    import tricks_lib.inference.allocators as allocators

    monkeypatch.setattr(allocators, "find_shared_library", lambda name: None if "jemalloc" in name else f"/lib/{name}")
    environments, missing = allocator_environments()
    assert environments == {
        "glibc malloc": {"LD_PRELOAD": None},
        "tcmalloc": {"LD_PRELOAD": "/lib/libtcmalloc_minimal.so.4"},
    }
    assert missing == {"jemalloc": "apt-get install -y libjemalloc2"}


@pytest.mark.slow
def test_loaded_allocators_sees_each_preload():
    environments, _ = allocator_environments()
    mapped = loaded_allocators(environments)
    assert mapped["glibc malloc"] == ()
    for name in set(environments) - {"glibc malloc"}:
        assert mapped[name] == (name,)


@pytest.mark.slow
def test_a_thread_sweep_reports_each_workers_threads():
    envs = {"one": {"OMP_NUM_THREADS": "1"}, "two": {"OMP_NUM_THREADS": "2"}}
    cmp = compare_environments(
        "values = list(range(100))", "sum(values)", envs, baseline="one", rounds=8, block_seconds=0.002, progress=True
    )
    assert isinstance(cmp, EnvironmentComparison) and cmp.thread_counts == (1, 2)
    assert [r.measurement.num_threads for r in cmp.rows] == [1, 2] and "1/2 threads per worker" in cmp._caption()


def test_progress_must_be_a_flag():
    with pytest.raises(TypeError, match="progress"):
        compare_environments("", "pass", ENVS, baseline="a", progress="yes")


def test_a_setup_that_hangs_is_stopped_at_the_timeout_with_its_children(tmp_path):
    import time

    from tricks_lib.inference.env_workers import evaluate_in_environments

    pid_file = tmp_path / "child.pid"
    setup = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="did not answer within 3 s"):
        evaluate_in_environments("1", {"hangs": {}}, setup=setup, timeout=3)
    assert time.perf_counter() - start < 30
    child = int(pid_file.read_text())
    assert gone_within(child, 5), "the setup's own child outlived the worker"
