"""What ``torch.compile`` costs the first time, measured the way a reader pays it.

A reader pays the compile in a fresh process: the first run of a notebook against empty caches, a
rerun against Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) but with nothing in memory:
Dynamo traces again, modules are imported again, kernels are loaded from disk. Timing the "warm" case
in the same process after ``torch._dynamo.reset()`` keeps Inductor's in-memory caches and imports and
reports a fraction of what a rerun pays. So ``compile_cost`` runs the first call twice in fresh
subprocesses, the first against an empty cache folder and the second reusing it, and reports
``import torch`` separately.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tricks_lib._processes import run_in_own_group
from tricks_lib.env import pick_device
from tricks_lib.formatting import format_seconds
from tricks_lib.measurements import Comparison
from tricks_lib.outcome import Outcome, SummaryRow
from tricks_lib.progress import optional_progress_bar as _progress_bar
from tricks_lib.timing import time_first_call

__all__ = [
    "BreakEven",
    "CompileCost",
    "FreshProcessCall",
    "calls_to_pay_off",
    "compile_cost",
    "first_call_in_fresh_process",
    "fresh_compile_cache",
]


def _inductor_config():
    """``torch._inductor.config``, imported on first use: importing Inductor costs about 1.5 s, which every
    ``import tricks_lib`` (each notebook kernel, test process and fresh-process worker) would otherwise pay."""
    import torch._inductor.config

    return torch._inductor.config


_CACHE_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"
_TRITON_CACHE_ENV_VAR = "TRITON_CACHE_DIR"
_RESULT_MARKER = "TRICKS_COMPILE_COST "

# What the child process runs: the clock starts before `import torch`, as a reader's kernel does.
_CHILD = textwrap.dedent(
    """
    import time
    _t0 = time.perf_counter()
    import json, os, sys
    import torch
    _t1 = time.perf_counter()
    _spec = json.loads(sys.stdin.read())
    torch.set_num_threads(_spec["threads"])
    if _spec["inductor_config"]:
        import torch._inductor.config
        torch._inductor.config.patch(_spec["inductor_config"]).__enter__()  # for the whole child process
    torch.set_grad_enabled(not _spec["no_grad"])
    from tricks_lib.env import pick_device
    from tricks_lib.timing import time_first_call
    _ns = {"DEVICE": pick_device(_spec["device"]), "__name__": "__compile_cost__"}
    exec(compile(_spec["setup"], "<compile_cost setup>", "exec"), _ns)
    _t2 = time.perf_counter()
    _call = compile(_spec["call"], "<compile_cost call>", "eval")
    _first = time_first_call(lambda: eval(_call, _ns), device=_ns["DEVICE"])
    print("%s%s" % (_spec["marker"], json.dumps(
        {"import_torch": _t1 - _t0, "setup": _t2 - _t1, "first_call": _first})), flush=True)
    """
)


@contextlib.contextmanager
def fresh_compile_cache() -> Iterator[str]:
    """Inside the block, ``torch.compile`` in this process starts from empty caches: in memory (Dynamo's graphs,
    Inductor's code caches) and on disk.

    Yields the fresh cache folder. The previous cache folder setting is restored on exit. The folder is
    kept until the process ends (compiled kernels inside it may still be loaded lazily, e.g. at the
    first backward).
    """
    previous = os.environ.get(_CACHE_ENV_VAR)
    folder = tempfile.mkdtemp(prefix="tricks-inductor-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[_CACHE_ENV_VAR] = folder
    torch._dynamo.reset()  # forget graphs compiled earlier in this process
    from torch._inductor.utils import clear_caches  # imported here: importing Inductor takes seconds

    clear_caches()  # ...and the kernels Inductor keeps in memory, which a new cache folder alone would not hide
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(_CACHE_ENV_VAR, None)
        else:
            os.environ[_CACHE_ENV_VAR] = previous


def calls_to_pay_off(first_seconds: float, eager_seconds: float, compiled_seconds: float) -> float | None:
    """Calls after which a compile has paid for itself; None when the compiled call is not faster.

    With ``n`` calls, compiling costs ``first + (n - 1) * compiled`` against ``n * eager``: it pays off from
    ``n = (first - compiled) / (eager - compiled)`` on, ``first`` being the compiled function's first call.

    Raises:
        TypeError / ValueError: times that are not positive numbers.
    """
    for name, value in (
        ("first_seconds", first_seconds),
        ("eager_seconds", eager_seconds),
        ("compiled_seconds", compiled_seconds),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number of seconds, got {value!r}")
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be positive, got {value!r}")
    saved = eager_seconds - compiled_seconds
    if saved <= 0:
        return None
    return max(first_seconds - compiled_seconds, 0.0) / saved


@dataclass(frozen=True)
class BreakEven:
    """The calls after which a compile pays for itself, from empty caches (cold) and a warm on-disk cache.

    Both None: it never pays off here (the compiled call was not significantly faster).
    """

    cold: int | None
    warm: int | None

    @property
    def pays_off(self) -> bool:
        return self.cold is not None and self.warm is not None

    def text(self, unit: str = "calls") -> str:
        """'pays off after 3,334 calls cold, 334 warm', or 'never pays off here'; ``unit`` names what is counted.

        Raises:
            TypeError / ValueError: ``unit`` is not a non-empty string, such as "calls" or "steps".
        """
        if not isinstance(unit, str):
            raise TypeError(f"unit must be a string such as 'calls' or 'steps', got {type(unit).__name__}")
        if not unit.strip():
            raise ValueError("unit must name what is counted, such as 'calls' or 'steps'")
        if not self.pays_off:
            return "never pays off here"
        return f"pays off after {self.cold:,} {unit} cold, {self.warm:,} warm"

    def __repr__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class CompileCost:
    """The first call of a compiled function in a fresh process, from empty caches and from warm ones.

    ``compiled`` runs the same call in this process (compiled against the warm cache, already called
    once) for the steady-state comparison; ``namespace`` holds what the setup built here.
    """

    record_kind: ClassVar[str] = "compile"  # the kind ``record()`` files it under

    cold_seconds: float  # first call, fresh process, empty caches: a reader's first run
    warm_seconds: float  # first call, fresh process, on-disk cache kept: a rerun of the notebook
    import_torch_seconds: float  # `import torch` in the fresh process (paid by every run, compiled or not)
    cold_process_seconds: float  # the whole cold child process, interpreter start to exit
    warm_process_seconds: float
    compiled: Callable[[], object] | None = field(repr=False, compare=False)  # None with compile_cost(here=False)
    namespace: dict = field(repr=False, compare=False)

    def first_call_seconds(self, cache: str = "cold") -> float:
        """The first call's seconds with ``cache`` "cold" (empty caches) or "warm" (on-disk cache kept)."""
        if cache not in ("cold", "warm"):
            raise ValueError(f"cache must be 'cold' or 'warm', got {cache!r}")
        return self.cold_seconds if cache == "cold" else self.warm_seconds

    def calls_to_pay_off(self, eager_seconds: float, compiled_seconds: float, *, cache: str = "cold") -> float | None:
        """Calls after which compiling has paid for itself (``calls_to_pay_off`` with this cost's fresh-process
        first call, ``cache`` "cold" or "warm"); None when the compiled call is not faster.

        Raises:
            TypeError / ValueError: times that are not positive numbers, or an unknown ``cache``.
        """
        return calls_to_pay_off(self.first_call_seconds(cache), eager_seconds, compiled_seconds)

    def break_even(self, comparison: Comparison, compiled: str, eager: str) -> BreakEven:
        """Calls after which compiling paid for itself, cold and warm (this cost's fresh-process first calls).

        Never (``BreakEven.pays_off`` False) unless ``compiled`` ran significantly faster than ``eager`` in
        ``comparison`` (``Outcome.FASTER``): a compile that buys nothing measurable is never paid back.

        Raises:
            KeyError: ``compiled`` or ``eager`` is not a variant of ``comparison``.
        """
        row = comparison.versus(compiled, eager)
        if row.outcome is not Outcome.FASTER:
            return BreakEven(None, None)
        eager_s, compiled_s = comparison[eager].measurement.median, comparison[compiled].measurement.median
        calls = [self.calls_to_pay_off(eager_s, compiled_s, cache=cache) for cache in ("cold", "warm")]
        if any(n is None for n in calls):
            return BreakEven(None, None)
        return BreakEven(*(max(1, math.ceil(n)) for n in calls))

    def __repr__(self) -> str:
        return (
            f"CompileCost(first call in a fresh process: {format_seconds(self.cold_seconds)} with empty caches, "
            f"{format_seconds(self.warm_seconds)} with a warm on-disk cache; import torch "
            f"{format_seconds(self.import_torch_seconds)})"
        )

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    def summary_rows(self) -> tuple[SummaryRow, ...]:
        device = str(self.namespace.get("DEVICE", "unknown"))
        return tuple(
            SummaryRow(variant=variant, device=device, median_s=seconds, verdict="one fresh process each")
            for variant, seconds in (
                ("first call, empty caches", self.cold_seconds),
                ("first call, warm on-disk cache", self.warm_seconds),
                ("import torch", self.import_torch_seconds),
            )
        )

    def to_dict(self) -> dict:
        return {
            "cold_first_call_s": self.cold_seconds,
            "warm_first_call_s": self.warm_seconds,
            "import_torch_s": self.import_torch_seconds,
            "cold_process_s": self.cold_process_seconds,
            "warm_process_s": self.warm_process_seconds,
        }


def _advance(bar) -> None:
    if bar is not None:
        bar.update(1)


def _run_child(
    setup: str, call: str, device: torch.device, cache_folder: str, timeout: float, inductor_config: dict, no_grad: bool
) -> tuple[dict, float]:
    """One fresh interpreter: import torch, run ``setup``, time the first ``call``. Returns (timings, wall)."""
    env = dict(os.environ)
    env[_CACHE_ENV_VAR] = cache_folder
    env[_TRITON_CACHE_ENV_VAR] = os.path.join(cache_folder, "triton")
    env["PYTHONUNBUFFERED"] = "1"
    spec = {
        "setup": setup,
        "call": call,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "marker": _RESULT_MARKER,
        "inductor_config": inductor_config,
        "no_grad": no_grad,
    }
    start = time.perf_counter()
    try:
        # Its own process group: a timeout or Ctrl-C stops the setup's own children too (compile workers).
        done = run_in_own_group([sys.executable, "-c", _CHILD], input=json.dumps(spec), env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"compile_cost: the fresh process did not finish within {timeout:.0f} s") from err
    wall = time.perf_counter() - start
    for line in done.stdout.splitlines():
        if line.startswith(_RESULT_MARKER):
            return json.loads(line[len(_RESULT_MARKER) :]), wall
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
    raise RuntimeError(f"compile_cost: the fresh process failed (exit code {done.returncode}):\n{tail}")


def _check_setup_and_call(setup: object, call: object, timeout: object):
    """The compiled ``call`` expression, once ``setup``, ``call`` and ``timeout`` are checked."""
    if not isinstance(setup, str):
        raise TypeError(f"setup must be Python source code (a str), got {type(setup).__name__}")
    if not isinstance(call, str):
        raise TypeError(f"call must be an expression (a str) such as 'f(x)', got {type(call).__name__}")
    if not call.strip():
        raise ValueError("call is empty: pass the expression to time, e.g. 'f(x)'")
    try:
        call_code = compile(call.strip(), "<compile_cost call>", "eval")
    except SyntaxError as err:
        raise ValueError(f"call must be a single expression such as 'f(x)': {err}") from err
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return call_code


@dataclass(frozen=True)
class FreshProcessCall:
    """One fresh interpreter's costs, in the order a reader's new process pays them."""

    import_torch_seconds: float  # `import torch`
    setup_seconds: float  # the setup source: building or loading the model (a package's load time)
    first_call_seconds: float  # the first call, device-synchronized
    process_seconds: float  # the whole process, interpreter start to exit

    def __repr__(self) -> str:
        return (
            f"FreshProcessCall(import torch {format_seconds(self.import_torch_seconds)}, setup "
            f"{format_seconds(self.setup_seconds)}, first call {format_seconds(self.first_call_seconds)})"
        )


def first_call_in_fresh_process(
    setup: str,
    call: str,
    *,
    device: str | torch.device | None = None,
    cache_folder: str | os.PathLike | None = None,
    timeout: float = 900.0,
) -> FreshProcessCall:
    """Run ``setup`` in a fresh interpreter and time it and the first ``call``, as a new process pays them.

    For one-off costs ``compile_cost`` does not cover: a package's load time (AOTInductor), a first call after
    loading saved compile artifacts. ``setup`` and ``call`` are as in ``compile_cost``.

    Args:
        cache_folder: Inductor's cache folder for the process (``TORCHINDUCTOR_CACHE_DIR``); None gives it a new
            empty one, removed afterwards: the process then finds nothing a previous one compiled.
        device, timeout: as in ``compile_cost``.

    Raises:
        TypeError / ValueError: as ``compile_cost``.
        RuntimeError: the process failed (the message ends with its error) or timed out.
    """
    _check_setup_and_call(setup, call, timeout)
    if cache_folder is not None and not isinstance(cache_folder, (str, os.PathLike)):
        raise TypeError(f"cache_folder must be a folder path or None, got {type(cache_folder).__name__}")
    dev = pick_device(device) if device is not None else pick_device()
    folder = tempfile.mkdtemp(prefix="tricks-inductor-") if cache_folder is None else os.fspath(cache_folder)
    try:
        found, wall = _run_child(textwrap.dedent(setup), call.strip(), dev, folder, timeout, {}, False)
    finally:
        if cache_folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    return FreshProcessCall(found["import_torch"], found["setup"], found["first_call"], wall)


def compile_cost(
    setup: str,
    call: str,
    *,
    device: str | torch.device | None = None,
    timeout: float = 900.0,
    progress: bool = False,
    inductor_config: dict | None = None,
    no_grad: bool = False,
    here: bool = True,
) -> CompileCost:
    """Time the first compiled call in fresh processes, cold and warm, and build the same call here.

    Args:
        setup: self-contained Python source that builds the inputs and calls ``torch.compile``, e.g.
            ``"import torch\\nx = torch.randn(1000)\\nf = torch.compile(torch.sin)"``. It runs in each
            fresh process and once in this one, with ``DEVICE`` (the chosen ``torch.device``) predefined.
            It may import ``tricks_lib``; it cannot see the caller's variables.
        call: an expression evaluated in setup's namespace, the call to time, e.g. ``"f(x)"``.
        device: whose queue is synchronized around the first call (default ``pick_device()``).
        timeout: seconds each fresh process may take at most.
        progress: show a progress bar over the three compiles (cold process, warm process, this one).
        inductor_config: ``torch._inductor.config`` settings, e.g. ``{"freezing": True}``: set for the
            whole of each fresh process, and here around setup and the first call only. Freezing
            needs this route: ``torch.compile(..., options={"freezing": True})`` does not freeze
            in torch 2.14 (notebook 05, section 7).
        no_grad: run the first calls with grad mode off (freezing needs it). Call ``compiled`` under
            ``torch.no_grad()`` too, or Dynamo recompiles it.
        here: also build and call ``call`` in this process (``compiled``); False skips that third compile
            where the caller times its own compiled function (``compiled`` and ``namespace`` are then empty).

    Returns:
        A ``CompileCost``; its ``compiled`` runs ``call`` in this process (compiled against the warm
        cache and called once, so ready for ``compare``), its ``namespace`` holds setup's objects.

    Raises:
        TypeError: ``setup`` or ``call`` is not a string.
        ValueError: ``call`` is empty or not an expression, or ``timeout`` is not positive.
        RuntimeError: a fresh process failed (the message ends with its error) or timed out.
        Whatever ``torch.compile`` raises in this process where it cannot run.
    """
    call_code = _check_setup_and_call(setup, call, timeout)
    for name, flag in (("progress", progress), ("no_grad", no_grad), ("here", here)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if inductor_config is not None and not isinstance(inductor_config, dict):
        raise TypeError(f"inductor_config must be a dict of torch._inductor.config settings, got {inductor_config!r}")
    config = dict(inductor_config or {})
    unknown = [key for key in config if key not in _inductor_config().get_config_copy()]
    if unknown:
        raise ValueError(f"inductor_config: {unknown} are not torch._inductor.config settings")
    setup = textwrap.dedent(setup)
    dev = pick_device(device) if device is not None else pick_device()
    bar = _progress_bar(progress, 3 if here else 2, "compile: cold process, warm process" + (", here" if here else ""))
    with fresh_compile_cache() as folder:
        cold, cold_wall = _run_child(setup, call.strip(), dev, folder, timeout, config, no_grad)
        _advance(bar)
        warm, warm_wall = _run_child(setup, call.strip(), dev, folder, timeout, config, no_grad)
        _advance(bar)
        namespace: dict = {"DEVICE": dev, "__name__": "__compile_cost__"}
        compiled = None
        if here:
            compiled = _build_here(setup, call_code, namespace, config, no_grad, dev)
            _advance(bar)
    if bar is not None:
        bar.close()
    return CompileCost(
        cold_seconds=cold["first_call"],
        warm_seconds=warm["first_call"],
        import_torch_seconds=cold["import_torch"],
        cold_process_seconds=cold_wall,
        warm_process_seconds=warm_wall,
        compiled=compiled,
        namespace=namespace,
    )


def _build_here(setup: str, call_code, namespace: dict, config: dict, no_grad: bool, dev: torch.device):
    """Run ``setup`` here into ``namespace`` and call once; return the call, ready for ``compare``."""
    # This process compiles against the cache the children filled: the steady state is what the
    # comparison needs, not this in-process first call (which would be neither cold nor a rerun).

    def compiled() -> object:
        return eval(call_code, namespace)

    with contextlib.ExitStack() as stack:
        if config:
            stack.enter_context(_inductor_config().patch(config))
        if no_grad:
            stack.enter_context(torch.no_grad())
        exec(compile(setup, "<compile_cost setup>", "exec"), namespace)
        time_first_call(compiled, device=dev)
    return compiled
