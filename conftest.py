"""Tests and notebook runs under pytest default to quick mode (small sizes, minutes on 2 cores)."""

import os

os.environ.setdefault("TRICKS_QUICK", "1")
# No progress bars in cells run by nbval: their text would reach the compared outputs.
os.environ.setdefault("TRICKS_PROGRESS", "0")
