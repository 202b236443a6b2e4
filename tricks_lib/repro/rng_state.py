"""Capture and restore every RNG state a training run uses, for checkpoints that resume bit for bit."""

from __future__ import annotations

import html
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from tricks_lib.repro.fingerprint import fingerprint


@dataclass(frozen=True, eq=False)  # tensors inside: compare with fingerprint(state.to_dict())
class RngState:
    """Every RNG state a training run draws from, captured at one moment.

    ``python``: ``random.getstate()``; ``numpy``: ``np.random.get_state()`` (the global generator);
    ``torch_cpu``: ``torch.get_rng_state()``; ``cuda``: one state per CUDA device (empty without
    CUDA); ``generators``: the states of the ``torch.Generator`` objects passed to
    ``capture_rng_state``, in that order (e.g. a DataLoader's generator).
    """

    python: tuple
    numpy: tuple
    torch_cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...]
    generators: tuple[torch.Tensor, ...]

    def __repr__(self) -> str:
        return (
            f"RngState(python, numpy, torch CPU, {len(self.cuda)} CUDA device(s), "
            f"{len(self.generators)} generator(s); fingerprint {fingerprint(self.to_dict())})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def to_dict(self) -> dict:
        """Plain tensors, numbers and strings only, so ``torch.load(..., weights_only=True)`` loads it."""
        version, internal, gauss = self.python
        name, keys, pos, has_gauss, cached_gaussian = self.numpy
        return {
            "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
            "numpy": {
                "algorithm": str(name),
                "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),  # uint32 values
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "torch_cpu": self.torch_cpu.clone(),
            "cuda": [s.clone() for s in self.cuda],
            "generators": [s.clone() for s in self.generators],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> RngState:
        """Rebuild an ``RngState`` from ``to_dict()``'s output.

        Raises:
            TypeError / ValueError: ``data`` is not a mapping shaped like ``to_dict()``'s output.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"from_dict needs the dict made by RngState.to_dict(), got {type(data).__name__}")
        try:
            py, npy = data["python"], data["numpy"]
            python = (int(py["version"]), tuple(int(v) for v in py["state"].tolist()), py["gauss"])
            numpy_state = (
                str(npy["algorithm"]),
                npy["keys"].cpu().numpy().astype(np.uint32),
                int(npy["pos"]),
                int(npy["has_gauss"]),
                float(npy["cached_gaussian"]),
            )
            return cls(
                python=python,
                numpy=numpy_state,
                # set_rng_state needs CPU uint8 tensors: a checkpoint loaded with map_location="cuda"
                # (or converted to another dtype) would otherwise fail to restore.
                torch_cpu=_cpu_bytes(data["torch_cpu"]),
                cuda=tuple(_cpu_bytes(s) for s in data["cuda"]),
                generators=tuple(_cpu_bytes(s) for s in data["generators"]),
            )
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"not a dict made by RngState.to_dict(): {exc!r}") from exc


def _cpu_bytes(state: torch.Tensor) -> torch.Tensor:
    """A generator state as a fresh CPU uint8 tensor, wherever and in whatever dtype it was loaded."""
    return state.to("cpu", torch.uint8, copy=True)


def _check_generators(generators: Iterable[torch.Generator]) -> tuple[torch.Generator, ...]:
    if isinstance(generators, torch.Generator):
        raise TypeError("pass generators as a list or tuple: generators=[loader_generator]")
    generators = tuple(generators)
    for g in generators:
        if not isinstance(g, torch.Generator):
            raise TypeError(f"generators must be torch.Generator objects, got {type(g).__name__}")
    return generators


def capture_rng_state(generators: Iterable[torch.Generator] = ()) -> RngState:
    """Capture Python's, NumPy's (global), torch's CPU and every CUDA device's RNG state.

    Args:
        generators: extra ``torch.Generator`` objects to capture, e.g. the DataLoader's generator
            (it decides the next epoch's shuffle order and worker seeds).

    Returns:
        An ``RngState``; pass it with the same generators, in the same order, to ``restore_rng_state``.

    Raises:
        TypeError: ``generators`` holds something other than ``torch.Generator`` objects.
    """
    generators = _check_generators(generators)
    # Querying CUDA's states initialises CUDA; fine here, CUDA is in use when it is available.
    cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else ()
    return RngState(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch_cpu=torch.get_rng_state(),
        cuda=cuda,
        generators=tuple(g.get_state() for g in generators),
    )


def restore_rng_state(state: RngState, generators: Iterable[torch.Generator] = ()) -> None:
    """Put back every RNG state captured by ``capture_rng_state``.

    Args:
        state: the captured states (``RngState.from_dict`` rebuilds one from a checkpoint).
        generators: the generators to restore, matching the ones captured, in the same order.

    Raises:
        TypeError: ``state`` is not an ``RngState`` or ``generators`` holds a non-generator.
        ValueError: the number of generators, or of CUDA devices, differs from the capture.
    """
    if not isinstance(state, RngState):
        raise TypeError(f"state must be an RngState from capture_rng_state(), got {type(state).__name__}")
    generators = _check_generators(generators)
    if len(generators) != len(state.generators):
        raise ValueError(
            f"{len(state.generators)} generator state(s) were captured but {len(generators)} generator(s) "
            "were given: pass the same generators, in the same order, as to capture_rng_state"
        )
    if state.cuda:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if devices != len(state.cuda):
            raise ValueError(
                f"the state holds {len(state.cuda)} CUDA device state(s) but this process sees {devices} "
                "CUDA device(s): resume on a machine with the same devices"
            )
        torch.cuda.set_rng_state_all(list(state.cuda))
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    torch.set_rng_state(state.torch_cpu)
    for g, s in zip(generators, state.generators):
        g.set_state(s)
