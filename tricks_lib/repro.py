"""Reproducibility: seeding, deterministic mode, DataLoader worker seeding, RNG checkpoints, fingerprints.

* ``seed_everything(seed)`` seeds Python's ``random``, NumPy's global generator and torch (CPU and
  every CUDA device), and sets ``PYTHONHASHSEED`` for *child* processes.
* ``seed_worker`` is a DataLoader ``worker_init_fn``: it reseeds ``random`` and NumPy's global
  generator from the worker's torch seed, and calls ``dataset.reseed(seed)`` when the dataset owns a
  generator of its own (the one thing PyTorch cannot reseed for you).
* ``make_generator(seed)`` gives a seeded ``torch.Generator`` for ``DataLoader(generator=...)``, so
  the shuffle order and the workers' seeds depend on this seed alone, not on how many random numbers
  the model drew before.
* ``deterministic()`` switches deterministic algorithms and cuDNN's flags on for a block and
  restores them afterwards. On CUDA it also needs ``CUBLAS_WORKSPACE_CONFIG``, which cuBLAS reads
  once per process: it sets it only while CUDA is not initialized yet (for the rest of the process),
  and raises when it is too late, instead of setting a value cuBLAS would never read.
* ``capture_rng_state()`` / ``restore_rng_state()`` save and restore every RNG state a training run
  uses, for checkpoints that resume bit for bit; ``RngState.to_dict()`` loads with
  ``torch.load(weights_only=True)``.
* ``fingerprint(obj)`` is a short hash of the exact bytes of a model, state dict or tensors:
  equal fingerprints mean bitwise-equal values.
* ``NoiseAugmentedDataset`` is the small dataset the notebook and tests use to show a NumPy
  generator created in ``__init__`` being duplicated across workers. It lives here (not in a
  notebook cell) so that workers started with ``spawn`` (macOS, Windows) can import it.

Nothing here runs at import time: importing changes no seed and no flag.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import random
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

__all__ = [
    "DeterminismFlags",
    "NoiseAugmentedDataset",
    "RngState",
    "capture_rng_state",
    "determinism_flags",
    "deterministic",
    "fingerprint",
    "make_generator",
    "restore_rng_state",
    "seed_everything",
    "seed_worker",
]

# One seed range for every library: NumPy's legacy seeding takes 0 .. 2**32 - 1 only.
MAX_SEED = 2**32 - 1
# The two values of CUBLAS_WORKSPACE_CONFIG that make cuBLAS deterministic (CUDA >= 10.2); the
# first uses ~24 MiB more GPU memory, the second can be slower.
CUBLAS_DETERMINISTIC_CONFIGS = (":4096:8", ":16:8")
_CUBLAS_ENV_VAR = "CUBLAS_WORKSPACE_CONFIG"
# Hex digits kept from the SHA-256: 64 bits, short enough to read, collisions negligible here.
_FINGERPRINT_DIGITS = 16


def _check_seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}: pass e.g. {name}=0")
    seed = int(seed)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(
            f"{name} must be in 0 .. 2**32 - 1 (NumPy's seed range), got {seed}: use e.g. {name} % 2**32"
        )
    return seed


# ---------------------------------------------------------------------------------------------
# Seeding
# ---------------------------------------------------------------------------------------------


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
    seed = _check_seed(seed)
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


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded with ``seed``, e.g. for ``DataLoader(generator=...)``.

    Args:
        seed: an int in 0 .. 2**32 - 1.
        device: the generator's device (a DataLoader needs a CPU generator).

    Raises:
        TypeError / ValueError: as ``seed_everything``.
    """
    seed = _check_seed(seed)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


# ---------------------------------------------------------------------------------------------
# Deterministic mode
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeterminismFlags:
    """The process-wide settings that decide whether kernels are deterministic."""

    algorithms: bool  # torch.use_deterministic_algorithms: nondeterministic ops raise (or warn)
    warn_only: bool  # ... warn instead of raising
    cudnn_deterministic: bool  # cuDNN picks only deterministic convolution algorithms
    cudnn_benchmark: bool  # cuDNN autotunes per input shape (the pick may differ between runs)
    mkldnn_deterministic: bool | None  # oneDNN's deterministic switch (None: not in this build)
    cublas_workspace_config: str | None  # the environment variable; None when unset

    def __repr__(self) -> str:
        return (
            f"DeterminismFlags(algorithms={self.algorithms}, warn_only={self.warn_only}, "
            f"cudnn.deterministic={self.cudnn_deterministic}, cudnn.benchmark={self.cudnn_benchmark}, "
            f"mkldnn.deterministic={self.mkldnn_deterministic}, "
            f"CUBLAS_WORKSPACE_CONFIG={self.cublas_workspace_config!r})"
        )


def determinism_flags() -> DeterminismFlags:
    """Read the current determinism settings (changes nothing)."""
    return DeterminismFlags(
        algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        mkldnn_deterministic=_get_mkldnn_deterministic(),
        cublas_workspace_config=os.environ.get(_CUBLAS_ENV_VAR),
    )


def _get_mkldnn_deterministic() -> bool | None:
    value = getattr(torch.backends.mkldnn, "deterministic", None)
    return None if value is None else bool(value)


def _apply_flags(flags: DeterminismFlags) -> None:
    torch.use_deterministic_algorithms(flags.algorithms, warn_only=flags.warn_only)
    torch.backends.cudnn.deterministic = flags.cudnn_deterministic
    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    if flags.mkldnn_deterministic is not None:
        torch.backends.mkldnn.deterministic = flags.mkldnn_deterministic
    # CUBLAS_WORKSPACE_CONFIG is not applied here: see _ensure_cublas_workspace_config.


def _ensure_cublas_workspace_config() -> str | None:
    """Make sure cuBLAS runs with a deterministic workspace in this process; return the variable's value.

    cuBLAS (through PyTorch's handle pool) reads ``CUBLAS_WORKSPACE_CONFIG`` once, when the process
    makes its first cuBLAS call, while ``use_deterministic_algorithms`` checks the variable at every
    call. Setting it after CUDA work began would therefore pass PyTorch's check without changing the
    workspace. So: without CUDA the variable is irrelevant and left alone; with a deterministic value
    there is nothing to do; before CUDA is initialized it is set, for the rest of the process (it is
    never restored: cuBLAS may read it at any later call); after, it is too late and this raises.
    """
    value = os.environ.get(_CUBLAS_ENV_VAR)
    if not torch.cuda.is_available() or value in CUBLAS_DETERMINISTIC_CONFIGS:
        return value
    if torch.cuda.is_initialized():
        current = "unset" if value is None else f"{value!r}, not a deterministic value"
        raise RuntimeError(
            f"deterministic(): {_CUBLAS_ENV_VAR} is {current}, and CUDA is already initialized in this "
            "process. cuBLAS reads the variable once, at its first call, so setting it now would not make "
            f"its matmuls deterministic. Set it before torch initializes CUDA: "
            f"os.environ.setdefault({_CUBLAS_ENV_VAR!r}, {CUBLAS_DETERMINISTIC_CONFIGS[0]!r}) before "
            "`import torch` (e.g. in the notebook's setup cell), or "
            f"`export {_CUBLAS_ENV_VAR}={CUBLAS_DETERMINISTIC_CONFIGS[0]}` in the shell; "
            f"{CUBLAS_DETERMINISTIC_CONFIGS[1]!r} also works (less memory, possibly slower)"
        )
    os.environ[_CUBLAS_ENV_VAR] = CUBLAS_DETERMINISTIC_CONFIGS[0]
    return os.environ[_CUBLAS_ENV_VAR]


@contextlib.contextmanager
def deterministic(enabled: bool = True, *, warn_only: bool = False) -> Iterator[DeterminismFlags]:
    """Run a block with deterministic kernels on (or off), then restore the flags it switched.

    ``enabled=True`` sets ``torch.use_deterministic_algorithms(True, warn_only=warn_only)`` (ops
    without a deterministic implementation raise ``RuntimeError``, or warn with ``warn_only``),
    ``cudnn.deterministic = True``, ``cudnn.benchmark = False`` (autotuning may pick a different
    algorithm per run) and oneDNN's ``mkldnn.deterministic = True`` where the build has it.
    ``enabled=False`` turns the three switches off and leaves benchmark alone. On exit, normal or by
    exception, their previous values come back. Use as ``with deterministic() as flags:``;
    ``flags`` are the values in effect inside the block.

    ``CUBLAS_WORKSPACE_CONFIG`` (needed on CUDA) is different: cuBLAS reads it once per process, at
    its first call, so a value set for one block and removed afterwards would only satisfy PyTorch's
    check, not change cuBLAS. With CUDA available and the variable not holding ``:4096:8`` or
    ``:16:8``, ``enabled=True`` therefore either sets it to ``:4096:8`` for the rest of the process
    (when CUDA is not initialized yet, so no cuBLAS call can have happened; it is not restored on
    exit) or raises. Set it before torch initializes CUDA: in the shell, or with
    ``os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")`` before ``import torch``.
    Without CUDA the variable is irrelevant and left as it is. ``enabled=False`` never touches it.

    Raises:
        TypeError: ``enabled`` or ``warn_only`` is not a bool.
        RuntimeError: ``enabled=True``, CUDA is available and already initialized in this process,
            and ``CUBLAS_WORKSPACE_CONFIG`` does not hold a deterministic value (nothing is changed).
    """
    if not isinstance(enabled, bool) or not isinstance(warn_only, bool):
        raise TypeError("enabled and warn_only must be bools: deterministic(True, warn_only=False)")
    previous = determinism_flags()
    if enabled:
        target = DeterminismFlags(
            algorithms=True,
            warn_only=warn_only,
            cudnn_deterministic=True,
            cudnn_benchmark=False,
            mkldnn_deterministic=None if previous.mkldnn_deterministic is None else True,
            cublas_workspace_config=_ensure_cublas_workspace_config(),  # raises before anything changed
        )
    else:
        target = DeterminismFlags(
            algorithms=False,
            warn_only=False,
            cudnn_deterministic=False,
            cudnn_benchmark=previous.cudnn_benchmark,
            mkldnn_deterministic=None if previous.mkldnn_deterministic is None else False,
            cublas_workspace_config=previous.cublas_workspace_config,
        )
    try:
        _apply_flags(target)
        yield target
    finally:
        _apply_flags(previous)


# ---------------------------------------------------------------------------------------------
# RNG state capture and restore
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------------

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_UNORDERED = (
    "a set (or a dict's keys()/items() view) has no stable order, so its fingerprint would change from "
    "run to run; pass a list sorted by a stable key, or the dict itself"
)


def _tensor_bytes(t: torch.Tensor, where: str) -> bytes:
    if t.layout != torch.strided:
        raise TypeError(f"{where}: {t.layout} tensors are not supported; fingerprint t.to_dense() instead")
    if t.is_quantized:
        raise TypeError(f"{where}: quantized tensors are not supported; fingerprint t.int_repr() instead")
    if t.device.type == "meta":
        raise TypeError(f"{where}: meta tensors hold no data to fingerprint")
    flat = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    # Reinterpret as raw bytes: works for every dtype, bf16 and fp8 included (NumPy has no bf16).
    return flat.view(torch.uint8).numpy().tobytes()


def _feed(h, obj: object, where: str) -> None:
    if isinstance(obj, torch.Tensor):
        h.update(f"tensor|{obj.dtype}|{tuple(obj.shape)}|".encode())
        h.update(_tensor_bytes(obj, where))
    elif isinstance(obj, np.ndarray):
        h.update(f"ndarray|{obj.dtype.str}|{obj.shape}|".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, torch.nn.Module):
        _feed(h, obj.state_dict(), where)  # parameters and buffers, by name
    elif isinstance(obj, Mapping):
        # Sorted by key so that two dicts with the same items match whatever their insertion order.
        items = sorted(obj.items(), key=lambda kv: repr(kv[0]))
        h.update(f"mapping|{len(items)}|".encode())
        for key, value in items:
            if not isinstance(key, _SCALARS):
                raise TypeError(f"{where}: mapping keys must be str/int/float/bool/None, got {type(key).__name__}")
            h.update(f"key|{type(key).__name__}|{key!r}|".encode())
            _feed(h, value, f"{where}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        h.update(f"sequence|{len(obj)}|".encode())
        for i, value in enumerate(obj):
            _feed(h, value, f"{where}[{i}]")
    elif isinstance(obj, (torch.dtype, torch.device, torch.Size)):
        h.update(f"{type(obj).__name__}|{obj}|".encode())
    elif isinstance(obj, np.generic) and not isinstance(obj, np.datetime64 | np.timedelta64):
        _feed(h, obj.item(), where)  # a NumPy scalar hashes like the Python number it holds
    elif isinstance(obj, _SCALARS):
        h.update(f"{type(obj).__name__}|{obj!r}|".encode())  # repr of a float is exact
    elif isinstance(obj, AbstractSet):
        raise TypeError(f"{where}: {_UNORDERED}")
    else:
        raise TypeError(
            f"{where}: cannot fingerprint a {type(obj).__name__}; pass tensors, arrays, modules, state "
            "dicts, or lists/tuples/dicts of them (numbers and strings are allowed inside)"
        )


def fingerprint(obj: object) -> str:
    """A short stable hash of the exact bytes of ``obj``: equal fingerprints mean bitwise-equal values.

    Accepted: a tensor; an ``nn.Module`` (its ``state_dict()``: parameters and buffers, by name);
    a mapping such as a model's or optimizer's state dict (keys sorted, values hashed recursively:
    tensors, NumPy arrays, nested dicts/lists, numbers (NumPy scalars hash as the Python number
    ``.item()`` gives), strings, None); or an iterable of tensors
    such as ``model.parameters()``. Each tensor contributes its dtype, shape and raw bytes (bf16,
    fp8 and complex included), not its device or ``requires_grad``; so a one-ulp change, a -0.0
    for a 0.0, a different dtype or shape, or a renamed key all change the fingerprint.

    Returns:
        16 hexadecimal digits (the first 64 bits of a SHA-256).

    Raises:
        TypeError: ``obj`` (or something inside it) is of an unsupported type, e.g. a string, a
            number or an arbitrary object at the top level, or a sparse, quantized or meta tensor;
            or it is unordered (a set, a frozenset, a dict's ``keys()`` or ``items()`` view), whose
            iteration order can differ between runs.
    """
    h = hashlib.sha256()
    if isinstance(obj, AbstractSet):  # set, frozenset, dict.keys(), dict.items(): no stable order
        raise TypeError(f"fingerprint: {_UNORDERED}")
    if isinstance(obj, (torch.Tensor, np.ndarray, torch.nn.Module, Mapping, list, tuple)):
        _feed(h, obj, "fingerprint")
    elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        items = list(obj)  # e.g. a generator such as model.parameters()
        if not all(isinstance(t, torch.Tensor) for t in items):
            raise TypeError("fingerprint: an iterable must yield tensors only, e.g. model.parameters()")
        _feed(h, items, "fingerprint")
    else:
        raise TypeError(
            f"fingerprint: cannot fingerprint a {type(obj).__name__}; pass a tensor, a module, a state "
            "dict or an iterable of tensors"
        )
    return h.hexdigest()[:_FINGERPRINT_DIGITS]


# ---------------------------------------------------------------------------------------------
# A dataset with its own generator (the worker-seeding demonstration)
# ---------------------------------------------------------------------------------------------


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
            raise ValueError(
                "seed is for the dataset's own generator: with own_generator=False, seed NumPy globally"
            )
        self.inputs = inputs
        self.targets = targets
        self.noise_std = float(noise_std)
        self.own_generator = own_generator
        # The generator created here is what every worker inherits a copy of.
        self.rng = np.random.default_rng(None if seed is None else _check_seed(seed)) if own_generator else None

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
        seed = _check_seed(seed)
        if self.own_generator:
            self.rng = np.random.default_rng(seed)
