"""Tests and notebook runs under pytest default to quick mode (small sizes, minutes on 2 cores)."""

import os

os.environ.setdefault("TRICKS_QUICK", "1")
