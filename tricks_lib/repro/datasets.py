"""A dataset with its own generator: the worker-seeding demonstration (importable by spawned workers)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from tricks_lib.repro.seeding import check_seed


class NoiseAugmentedDataset(Dataset):
    """``(inputs[i] + noise_std * noise, targets[i])``, the noise drawn from a NumPy generator
    created in ``__init__``.

    A common pattern, and a trap: with ``num_workers > 0`` every worker gets a copy of the dataset,
    generator state included, so all workers draw the same noise; and since workers are started
    afresh each epoch from the untouched parent copy, every epoch repeats it. ``seed_worker`` fixes
    both by calling ``reseed`` in each worker with that worker's seed.

    Args:
        inputs: (N, ...) float tensor.
        targets: (N, ...) tensor.
        noise_std: standard deviation of the added Gaussian noise (>= 0).
        seed: seed of the generator (None: fresh entropy from the OS, different every run).
        own_generator: False draws from NumPy's *global* generator instead (``np.random``), the
            pattern behind the pre-1.9 bug; PyTorch >= 1.9 reseeds that one in every worker.

    Raises:
        TypeError / ValueError: non-tensor or non-float inputs, mismatched lengths, a negative
            ``noise_std``, a bad seed, or a seed given with ``own_generator=False``.
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        noise_std: float = 0.1,
        seed: int | None = None,
        own_generator: bool = True,
    ) -> None:
        if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
            raise TypeError("inputs and targets must be tensors")
        if not inputs.is_floating_point():
            raise TypeError(f"inputs must be a floating-point tensor, got {inputs.dtype}")
        if inputs.ndim == 0 or len(inputs) != len(targets):
            raise ValueError(
                "inputs and targets need the same first dimension, got "
                f"{tuple(inputs.shape)} and {tuple(targets.shape)}"
            )
        if not noise_std >= 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        if not isinstance(own_generator, bool):
            raise TypeError("own_generator must be a bool")
        if not own_generator and seed is not None:
            raise ValueError("seed is for the dataset's own generator: with own_generator=False, seed NumPy globally")
        self.inputs = inputs
        self.targets = targets
        self.noise_std = float(noise_std)
        self.own_generator = own_generator
        # The generator created here is what every worker inherits a copy of.
        self.rng = np.random.default_rng(None if seed is None else check_seed(seed)) if own_generator else None

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.inputs[index]  # (...)
        if self.own_generator:
            draw = self.rng.standard_normal(tuple(x.shape), dtype=np.float32)
        else:
            draw = np.random.standard_normal(tuple(x.shape)).astype(np.float32)  # legacy API: no dtype=
        noise = torch.from_numpy(draw).to(x.dtype)
        return x + self.noise_std * noise, self.targets[index]

    def reseed(self, seed: int) -> None:
        """Replace the own generator by one seeded with ``seed`` (``seed_worker`` calls this in each
        worker); with ``own_generator=False`` there is nothing to replace and this does nothing."""
        seed = check_seed(seed)
        if self.own_generator:
            self.rng = np.random.default_rng(seed)
