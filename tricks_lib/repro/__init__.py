"""Reproducibility: seeding, deterministic mode, DataLoader worker seeding, RNG checkpoints, fingerprints.

* ``seed_everything(seed)`` seeds Python's ``random``, NumPy's global generator and torch (CPU and
  every CUDA device), and sets ``PYTHONHASHSEED`` for *child* processes.
* ``seed_worker`` is a DataLoader ``worker_init_fn``: it reseeds ``random`` and NumPy's global
  generator from the worker's torch seed, and calls ``dataset.reseed(seed)`` when the dataset owns a
  generator of its own (the one thing PyTorch cannot reseed for you).
* ``deterministic()`` switches deterministic algorithms and cuDNN's flags on for a block and
  restores them afterwards. On CUDA it also needs ``CUBLAS_WORKSPACE_CONFIG``, which cuBLAS reads
  once per process: it sets it only while CUDA is not initialized yet (for the rest of the process),
  and raises when it is too late, instead of setting a value cuBLAS would never read.
* ``fingerprint(obj)`` is a short hash of the exact bytes of a model, state dict or tensors:
  equal fingerprints mean bitwise-equal values.
* ``NoiseAugmentedDataset`` is the small dataset the notebook and tests use to show a NumPy
  generator created in ``__init__`` being duplicated across workers. It lives here (not in a
  notebook cell) so that workers started with ``spawn`` (macOS, Windows) can import it.

Nothing here runs at import time: importing changes no seed and no flag. One module per concern:
``seeding``, ``determinism``, ``fingerprint``, ``datasets``.
"""

from tricks_lib.repro.datasets import NoiseAugmentedDataset
from tricks_lib.repro.determinism import (
    CUBLAS_DETERMINISTIC_CONFIGS,
    DeterminismFlags,
    determinism_flags,
    deterministic,
)
from tricks_lib.repro.fingerprint import fingerprint
from tricks_lib.repro.seeding import MAX_SEED, seed_everything, seed_worker

__all__ = [
    "CUBLAS_DETERMINISTIC_CONFIGS",
    "MAX_SEED",
    "DeterminismFlags",
    "NoiseAugmentedDataset",
    "determinism_flags",
    "deterministic",
    "fingerprint",
    "seed_everything",
    "seed_worker",
]
