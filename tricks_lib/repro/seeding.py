"""Seeding: every library's global generator from one seed, and DataLoader workers."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from torch.utils.data import get_worker_info

# One seed range for every library: NumPy's legacy seeding takes 0 .. 2**32 - 1 only.
MAX_SEED = 2**32 - 1


def check_seed(seed: object, name: str = "seed") -> int:
    """``seed`` as an int, or TypeError/ValueError saying what a seed must be (shared by ``repro``)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}: pass e.g. {name}=0")
    seed = int(seed)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be in 0 .. 2**32 - 1 (NumPy's seed range), got {seed}: use e.g. {name} % 2**32")
    return seed


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and all CUDA devices).

    Also sets the environment variable ``PYTHONHASHSEED`` to ``seed``. That only affects processes
    started *after* this call (subprocesses, ``spawn``/``forkserver`` DataLoader workers): a running
    interpreter fixed its string-hash secret at start-up, and ``fork`` workers inherit the parent's.
    To fix string hashing of the current process, export the variable before starting Python.

    Args:
        seed: an int in 0 .. 2**32 - 1.

    Raises:
        TypeError: ``seed`` is not an int (bools are refused too).
        ValueError: ``seed`` is negative or above 2**32 - 1.
    """
    seed = check_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    # Seeds the CPU generator and every CUDA device's (lazily, if CUDA is not initialised yet).
    torch.manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for a DataLoader: reseed the worker's own random generators.

    Inside a worker, ``torch.initial_seed()`` is ``base_seed + worker_id``, where ``base_seed`` is
    drawn from the DataLoader's ``generator`` (or torch's global generator) once per epoch. This
    reseeds ``random`` and NumPy's global generator from it (the recipe of PyTorch's reproducibility
    notes), and, when the worker's dataset has a ``reseed(seed)`` method, calls it with the same
    seed so that a generator the dataset created in ``__init__`` (copied into every worker) is
    replaced by one that differs per worker and per epoch. Outside a worker only the global
    generators are reseeded.

    Args:
        worker_id: the id the DataLoader passes (0 .. num_workers - 1).

    Raises:
        TypeError / ValueError: ``worker_id`` is not a non-negative int.
    """
    if isinstance(worker_id, bool) or not isinstance(worker_id, int):
        raise TypeError(f"worker_id must be an int, got {type(worker_id).__name__}")
    if worker_id < 0:
        raise ValueError(f"worker_id must be >= 0, got {worker_id}")
    worker_seed = torch.initial_seed() % 2**32  # NumPy's legacy seeding takes 32 bits
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    info = get_worker_info()
    if info is not None:
        reseed = getattr(info.dataset, "reseed", None)
        if callable(reseed):
            reseed(worker_seed)
