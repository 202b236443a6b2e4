"""tricks_lib.compiling: cold and warm first-call cost of torch.compile."""

import os

import pytest
import torch

from tricks_lib.compiling import CompileCost, compile_cost, fresh_compile_cache


def test_fresh_cache_restores_the_setting(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    with fresh_compile_cache():
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert inside != "/somewhere/else" and os.path.isdir(inside) and not os.listdir(inside)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"


def test_cold_compile_is_slower_than_warm_and_results_match():
    x = torch.randn(1024)

    def f(t):
        return torch.sigmoid(t) * t + 1.0

    fn, cost = compile_cost(lambda: (lambda c=torch.compile(f): c(x)), device="cpu")
    assert isinstance(cost, CompileCost)
    torch.testing.assert_close(fn(), f(x))
    # From empty caches Inductor generates and builds C++; from a warm disk cache it only loads it.
    assert cost.cold_seconds > 2 * cost.warm_seconds
    assert cost.calls_to_pay_off(1.0, 0.5) == pytest.approx(cost.cold_seconds / 0.5)
    assert cost.calls_to_pay_off(0.5, 1.0) is None
    assert "empty caches" in repr(cost)


def test_bad_arguments():
    with pytest.raises(TypeError, match="function that returns"):
        compile_cost(42)
    with pytest.raises(TypeError, match="must return a callable"):
        compile_cost(lambda: 3)
