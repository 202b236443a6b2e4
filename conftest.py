"""Tests and notebook runs under pytest default to quick mode (small sizes, minutes on 2 cores)."""

import os

os.environ.setdefault("TRICKS_QUICK", "1")
# No progress bars in cells run by nbval: their text would reach the compared outputs.
os.environ.setdefault("TRICKS_PROGRESS", "0")


def pytest_collection_modifyitems(config, items):
    """Every notebook cell (nbval) counts as slow: a notebook starts a kernel and runs for minutes."""
    import pytest

    for item in items:
        if str(item.fspath).endswith(".ipynb"):
            item.add_marker(pytest.mark.slow)
