"""Results with known numbers, shared by the tests that read them (verdicts, probe tables, FLOP rankings).

Importable from every test folder: ``tests/`` is on ``sys.path`` because its ``conftest.py`` lives there.
"""

from tricks_lib.measurements import Comparison, ComparisonRow, Measurement


def timed(label, seconds, rounds=20, items=None, jitter=0.002):
    """A Measurement of ``rounds`` blocks of ``seconds`` per call, alternating +-``jitter`` per round: a spread,
    and paired ratios that are the same every round."""
    times = tuple(seconds * (1 + (jitter if i % 2 else -jitter)) for i in range(rounds))
    return Measurement(label, times, 1, "cpu", 2, items=items)


def known_comparison(costs, baseline, items=None, *, label="c", min_effect=0.03):
    """A Comparison read from known per-call times ``{name: seconds}``, through the same ``Comparison.versus``
    the harness uses; ``items`` ({name: count}) makes it a per-item (throughput) comparison."""
    measurements = {name: timed(name, s, items=(items or {}).get(name)) for name, s in costs.items()}
    rows = tuple(ComparisonRow(n, m, 1.0, 1.0, 1.0, False, n == baseline) for n, m in measurements.items())
    per_item = bool(items)
    c = Comparison(label, baseline, rows, 20, "cpu", 2, min_effect, per_item=per_item)
    return Comparison(
        label, baseline, tuple(c.versus(n, baseline) for n in costs), 20, "cpu", 2, min_effect, per_item=per_item
    )
