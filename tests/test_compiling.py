"""tricks_lib.compiling: the first compiled call in fresh processes, cold and warm, and the break-even."""

import os

import pytest
import torch
from process_state import gone_within

from tricks_lib.compiling import CompileCost, compile_cost, fresh_compile_cache
from tricks_lib.inference.compiled import export_for_fresh_processes


def test_fresh_cache_restores_the_setting(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    with fresh_compile_cache() as folder:
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert inside == folder != "/somewhere/else" and os.path.isdir(inside) and not os.listdir(inside)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"


@pytest.mark.slow
def test_cold_and_warm_first_calls_run_in_fresh_processes_with_the_config_and_grad_mode(tmp_path):
    # The setup logs its process id, cache folder, Inductor flag and grad mode: it must run in two
    # child processes (cold, warm) and once in this one, each with the config and grad mode asked
    # for. (One compile_cost call for both properties: each call pays two fresh torch processes.)
    log = tmp_path / "runs.txt"
    setup = f"""
        import os, torch
        with open({str(log)!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{os.environ.get('TORCHINDUCTOR_CACHE_DIR')}} "
                    f"{{torch._inductor.config.freezing}} {{torch.is_grad_enabled()}}\\n")
        def f(t):
            return torch.sigmoid(t) * t + 1.0
        x = torch.ones(1024, device=DEVICE)
        compiled_f = torch.compile(f)
    """
    cost = compile_cost(setup, "compiled_f(x)", device="cpu", inductor_config={"freezing": True}, no_grad=True)
    assert isinstance(cost, CompileCost)
    lines = [line.split() for line in log.read_text().splitlines()]
    pids = [int(line[0]) for line in lines]
    assert len(pids) == 3 and pids[2] == os.getpid() and len({pids[0], pids[1], os.getpid()}) == 3
    assert lines[0][1] == lines[1][1]  # the warm child reuses the cold child's cache folder
    assert [line[2:] for line in lines] == [["True", "False"]] * 3  # cold child, warm child, this process
    assert not torch._inductor.config.freezing and torch.is_grad_enabled()  # restored here
    with torch.no_grad():
        torch.testing.assert_close(cost.compiled(), torch.sigmoid(torch.ones(1024)) + 1.0)
    assert cost.namespace["x"].shape == (1024,)
    # From empty caches Inductor generates and builds C++; from a warm disk cache it loads it, but a
    # fresh process still traces the function again, so the warm call is not free.
    assert cost.cold_seconds > cost.warm_seconds > 0
    assert 0 < cost.import_torch_seconds < cost.cold_process_seconds
    assert cost.cold_process_seconds > cost.cold_seconds
    assert "fresh process" in repr(cost) and set(cost.to_dict()) >= {"cold_first_call_s", "import_torch_s"}


@pytest.mark.slow
def test_a_failing_setup_names_the_error():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compile_cost("import torch\n1 / 0", "None", device="cpu")


def _cost(cold, warm):
    return CompileCost(
        cold_seconds=cold,
        warm_seconds=warm,
        import_torch_seconds=1.0,
        cold_process_seconds=cold + 2,
        warm_process_seconds=warm + 2,
        compiled=lambda: None,
        namespace={},
    )


def test_break_even_counts_the_first_call_against_the_saving():
    cost = _cost(cold=10.0, warm=1.0)
    # n calls: first + (n - 1) * compiled against n * eager.
    assert cost.calls_to_pay_off(0.3, 0.1) == pytest.approx((10.0 - 0.1) / 0.2)
    assert cost.calls_to_pay_off(0.3, 0.1, cache="warm") == pytest.approx((1.0 - 0.1) / 0.2)
    assert cost.calls_to_pay_off(0.1, 0.3) is None
    assert cost.calls_to_pay_off(0.1, 0.1) is None
    with pytest.raises(ValueError, match="cold"):
        cost.calls_to_pay_off(0.3, 0.1, cache="hot")
    with pytest.raises(ValueError, match="positive"):
        cost.calls_to_pay_off(0.0, 0.1)
    with pytest.raises(TypeError, match="seconds"):
        cost.calls_to_pay_off("0.3", 0.1)


def test_bad_arguments():
    with pytest.raises(TypeError, match="source"):
        compile_cost(42, "f(x)")
    with pytest.raises(TypeError, match="expression"):
        compile_cost("x = 1", lambda: 3)
    with pytest.raises(ValueError, match="empty"):
        compile_cost("x = 1", "  ")
    with pytest.raises(ValueError, match="single expression"):
        compile_cost("x = 1", "y = x")
    with pytest.raises(ValueError, match="timeout"):
        compile_cost("x = 1", "x", timeout=0)


def test_export_for_fresh_processes_round_trips(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    x = torch.randn(2, 4)
    setup = export_for_fresh_processes(model, (x,), tmp_path)
    namespace = {}
    exec(setup, namespace)  # what a fresh process runs
    torch.testing.assert_close(namespace["model"](*namespace["inputs"]), model(x))
    # The inputs load with weights_only=True: a planted pickle in the folder cannot run code in the fresh process
    # (torch.load's own default is that only from torch 2.6, and the project allows older).
    assert "weights_only=True" in setup
    with pytest.raises(TypeError, match="tuple"):
        export_for_fresh_processes(model, x, tmp_path)


def test_compile_cost_checks_its_new_options():
    with pytest.raises(ValueError, match="not torch._inductor.config settings"):
        compile_cost("x = 1", "x", inductor_config={"freezzing": True})
    with pytest.raises(TypeError, match="no_grad"):
        compile_cost("x = 1", "x", no_grad=1)
    with pytest.raises(TypeError, match="progress"):
        compile_cost("x = 1", "x", progress="yes")
    with pytest.raises(TypeError, match="here"):
        compile_cost("x = 1", "x", here="no")


def test_a_timeout_stops_the_fresh_process_and_what_its_setup_started(tmp_path):

    pid_file = tmp_path / "grandchild.pid"
    setup = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(RuntimeError, match="did not finish within 8 s"):
        compile_cost(setup, "None", device="cpu", timeout=8)
    grandchild = int(pid_file.read_text())
    assert gone_within(grandchild, 5), "the setup's child outlived the timed-out fresh process"


def test_calls_to_pay_off_from_a_first_call_and_the_two_steady_states():
    from tricks_lib.compiling import calls_to_pay_off

    assert calls_to_pay_off(10.0, 0.3, 0.1) == pytest.approx((10.0 - 0.1) / 0.2)
    assert calls_to_pay_off(0.05, 0.3, 0.1) == 0.0  # a first call no slower than the compiled one pays at once
    assert calls_to_pay_off(10.0, 0.1, 0.3) is None
    with pytest.raises(ValueError, match="first_seconds"):
        calls_to_pay_off(0.0, 0.3, 0.1)
    with pytest.raises(TypeError, match="eager_seconds"):
        calls_to_pay_off(1.0, "0.3", 0.1)


@pytest.mark.slow
def test_first_call_in_fresh_process_times_setup_and_call_in_a_new_interpreter_with_its_own_cache(tmp_path):
    from tricks_lib.compiling import FreshProcessCall, first_call_in_fresh_process

    log = tmp_path / "env.txt"
    setup = f"""
        import os, torch
        open({str(log)!r}, "w").write(f"{{os.getpid()}} {{os.environ['TORCHINDUCTOR_CACHE_DIR']}}")
        x = torch.ones(3)
    """
    found = first_call_in_fresh_process(setup, "x + 1", device="cpu", cache_folder=tmp_path / "cache")
    assert isinstance(found, FreshProcessCall) and "first call" in repr(found)
    pid, cache = log.read_text().split()
    assert int(pid) != os.getpid() and cache == str(tmp_path / "cache")
    assert found.first_call_seconds > 0 and found.setup_seconds > 0
    assert found.process_seconds > found.import_torch_seconds + found.setup_seconds
    first_call_in_fresh_process(setup, "x + 1", device="cpu")  # a new empty cache folder, removed afterwards
    assert log.read_text().split()[1] != cache
    with pytest.raises(TypeError, match="cache_folder"):
        first_call_in_fresh_process(setup, "x", cache_folder=3)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        first_call_in_fresh_process("1 / 0", "None", device="cpu")
