"""compare_environments / evaluate_in_environments: each worker process runs under its own environment."""

import pytest

from tricks_lib.env_compare import compare_environments, evaluate_in_environments, find_shared_library

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


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="baseline"):
        compare_environments("", "pass", ENVS, baseline="c")
    with pytest.raises(ValueError, match="rounds"):
        compare_environments("", "pass", ENVS, baseline="a", rounds=3)
    with pytest.raises(TypeError):
        compare_environments("", "pass", {"a": {"X": 1}}, baseline="a")
    assert find_shared_library("libdefinitely-not-here.so.9") is None
