"""launch_torchrun: each rank's results read back from its file; a crash at teardown after the results never fails a run."""

import pytest

from tricks_lib.training.torchrun import RESULT_FOLDER_VARIABLE, TorchrunResult, launch_torchrun

WRITES = f"""
import json, os
rank = int(os.environ["RANK"])
folder = os.environ["{RESULT_FOLDER_VARIABLE}"]
with open(os.path.join(folder, f".rank{{rank}}.json"), "w") as f:
    json.dump({{"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "threads": os.environ["OMP_NUM_THREADS"]}}, f)
os.replace(os.path.join(folder, f".rank{{rank}}.json"), os.path.join(folder, f"rank{{rank}}.json"))
"""


@pytest.mark.slow
def test_each_ranks_results_come_back_in_rank_order(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WRITES)
    run = launch_torchrun(script, processes=2, threads=1, timeout=120)
    assert isinstance(run, TorchrunResult) and run.returncode == 0 and run.teardown_error == ""
    assert [r["rank"] for r in run.ranks] == [0, 1] and {r["world"] for r in run.ranks} == {2}
    assert {r["threads"] for r in run.ranks} == {"1"} and run.seconds > 0 and "ended cleanly" in repr(run)


@pytest.mark.slow
def test_a_rank_that_crashes_after_writing_its_results_does_not_fail_the_run(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WRITES + "os.abort()  # as gloo's teardown does now and then\n")
    run = launch_torchrun(script, processes=2, timeout=120)
    assert run.returncode != 0 and run.teardown_error and len(run.ranks) == 2
    assert "at teardown" in repr(run)


@pytest.mark.slow
def test_a_rank_without_results_raises_with_the_launch_output(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise SystemExit('rank 1 gave up')\n" + WRITES)
    with pytest.raises(RuntimeError, match=r"no results from \['rank1.json'\]"):
        launch_torchrun(script, processes=2, timeout=120)


def test_bad_arguments_are_refused_with_what_to_do(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("pass\n")
    with pytest.raises(ValueError, match="write the worker script first"):
        launch_torchrun(tmp_path / "missing.py")
    with pytest.raises(TypeError, match="script"):
        launch_torchrun(42)
    with pytest.raises(ValueError, match="processes"):
        launch_torchrun(script, processes=0)
    with pytest.raises(TypeError, match="args"):
        launch_torchrun(script, args="--steps 3")
    with pytest.raises(TypeError, match="threads"):
        launch_torchrun(script, threads=1.5)
