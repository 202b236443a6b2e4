"""FLOPs and memory access cost: the two proxies for speed that model-design papers argue about.

* ``count_flops(module, *inputs)``: floating-point operations of one forward pass, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (PyTorch's own counter). A multiply-add counts as
  **2** FLOPs, so a ``Linear(i, o)`` on ``n`` rows costs ``2 * n * i * o``; papers that report
  "FLOPs" as multiply-adds (ShuffleNet V2, MobileNet) quote half these numbers.
* ``conv_memory_access_cost(c1, c2, h, w, kernel_size=k, groups=g)``: the memory access cost (MAC)
  of a convolution in elements, ``hw(c1 + c2) + k^2 c1 c2 / g`` (feature maps in and out, plus the
  weights), the model of ShuffleNet V2 (Ma et al. 2018, Eq. 1-2) that assumes every tensor is read
  or written exactly once.
* ``conv1x1_memory_access_cost(c1, c2, h, w, groups=1)``: the paper's formula for 1x1 convolutions,
  ``hw(c1 + c2) + c1 c2 / g``.
* ``count_memory_access(module, *inputs)``: the same model summed over a whole network's convolution
  and linear layers in one forward pass (input, output and weights of each, measured with hooks).
* ``count_elementwise_access(module, *inputs)``: the elements that element-wise ops (ReLU, additions,
  multiplications, ...) read and write in one forward pass: the traffic that guideline G4 of
  ShuffleNet V2 is about, which neither of the two counters above sees.
* ``rank_by_flops(comparison, flops, mac)``: how well FLOPs order timed models, every pair read from
  the same paired rounds (a ``FlopRanking``, which renders as a table).

Every counter runs its forward pass on one intra-op thread (restored afterwards): the counts do not
depend on it, and on a busy machine two threads spend far longer synchronizing than computing.

``FlopCounterMode`` counts convolutions, matmuls and attention kernels: element-wise ops (ReLU,
additions, BatchNorm in eval mode) count zero, which is the blind spot guideline G4 is about and the
reason ``count_elementwise_access`` exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tricks_lib.formatting import format_seconds, markdown_table

if TYPE_CHECKING:
    from tricks_lib.measurements import Comparison

__all__ = [
    "FlopRanking",
    "conv1x1_memory_access_cost",
    "conv_memory_access_cost",
    "count_elementwise_access",
    "count_flops",
    "count_memory_access",
    "rank_by_flops",
]


def _check_forward_args(module: object, inputs: tuple) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if not inputs:
        raise ValueError("pass the forward's inputs too, e.g. count_flops(model, torch.randn(1, 3, 224, 224))")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"inputs[{i}] must be a tensor, got {type(x).__name__}")


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``scaled_dot_product_attention``'s CPU kernel: the same formula torch registers for its GPU ones."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flop_formulas() -> dict:
    """Formulas ``FlopCounterMode`` lacks (torch 2.14): the CPU kernel of ``scaled_dot_product_attention``, which
    it would count as 0."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {} if op is None else {op: _sdpa_cpu_flops}


@contextlib.contextmanager
def _counting_forward(module: nn.Module):
    """Eval mode (BatchNorm statistics and dropout untouched), autograd on and the attention fast path off, one
    thread; the training flag, the fast-path switch and the thread count are restored afterwards.

    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` take a fused inference kernel in eval mode
    without autograd, whose FLOPs no counter sees; with autograd on and the fast path off they run the
    decomposed matmuls that a training forward runs.
    """
    was_training = module.training
    mha = getattr(torch.backends, "mha", None)
    fast_path = mha.get_fastpath_enabled() if mha is not None else None
    module.eval()
    try:
        if mha is not None:
            mha.set_fastpath_enabled(False)
        with torch.enable_grad(), _one_thread():
            yield
    finally:
        if mha is not None:
            mha.set_fastpath_enabled(fast_path)
        module.train(was_training)


def count_flops(module: nn.Module, *inputs: torch.Tensor) -> int:
    """FLOPs of one forward pass of ``module(*inputs)``, counted on the ops a training forward runs.

    A multiply-add is 2 FLOPs. The forward runs in eval mode (BatchNorm statistics and dropout untouched)
    but with autograd on and PyTorch's attention fast path off, so ``nn.MultiheadAttention`` runs its
    projections and matmuls (a 1x64x128, 4-head block: 10,485,760 FLOPs) instead of a fused inference
    kernel that would count 0; ``scaled_dot_product_attention``'s CPU kernel is counted with the formula
    torch uses for its GPU kernels. Element-wise ops count 0 (``count_elementwise_access`` counts their
    traffic). The module's training flag is restored afterwards, so counting never changes how a model
    later trains.

    Args:
        module: the model or layer.
        *inputs: the tensors passed to its forward (at least one).

    Returns:
        The total FLOP count as an int.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` or an input is not a tensor.
        ValueError: no input was given.
    """
    _check_forward_args(module, inputs)
    counter = FlopCounterMode(display=False, custom_mapping=_flop_formulas())
    with _counting_forward(module), counter:
        module(*inputs)
    return int(counter.get_total_flops())


class _ElementwiseTraffic(TorchDispatchMode):
    """Sums the elements that ops tagged ``pointwise`` read (tensor arguments) and write (tensor results)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if torch.Tag.pointwise in func.tags:
            # read: every tensor argument but an ``out=`` buffer; written: every tensor result (an in-place op's
            # ``self`` is both, as it is read and then written)
            reads = pytree.tree_leaves((args, {k: v for k, v in kwargs.items() if k != "out"}))
            tensors = [t for t in (*reads, *pytree.tree_leaves(out)) if isinstance(t, torch.Tensor)]
            self.elements += sum(t.numel() for t in tensors)
        return out


def count_elementwise_access(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Elements read and written by the element-wise ops of one forward pass (ReLU, additions, multiplications, ...).

    An op counts when PyTorch tags it ``pointwise``: each tensor it reads and each it writes counts its
    elements once (an in-place ``relu_`` on ``n`` elements moves ``2n``, an addition of two ``n``-element
    tensors ``3n``), the cache-free model of ShuffleNet V2's MAC applied to the ops its formula leaves out.
    Reductions, normalizations with their own kernels (BatchNorm, LayerNorm, softmax) and copies are not
    counted. Multiply by the element size for bytes. Runs as ``count_flops`` does (eval mode, autograd on,
    one thread; the training flag restored).

    Raises:
        TypeError / ValueError: as ``count_flops``.
    """
    _check_forward_args(module, inputs)
    traffic = _ElementwiseTraffic()
    with _counting_forward(module), traffic:
        module(*inputs)
    return traffic.elements


def _check_size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def conv_memory_access_cost(c1: int, c2: int, h: int, w: int, *, kernel_size: int = 1, groups: int = 1) -> int:
    """Memory access cost of a stride-1 ``k x k`` convolution in elements: ``hw(c1 + c2) + k^2 c1 c2 / g``.

    ``hw c1`` elements read (input), ``hw c2`` written (output), ``k^2 c1 c2 / g`` weights read: every
    tensor touched once, as if the cache held them all (the model of ShuffleNet V2, Eq. 1-2).

    Args:
        c1, c2: input and output channels.
        h, w: spatial size of the feature map.
        kernel_size: side of the square kernel (1 for the paper's pointwise case).
        groups: convolution groups; must divide both ``c1`` and ``c2``.

    Returns:
        The number of elements moved, as an int.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below 1, or ``groups`` not dividing ``c1`` and ``c2``.
    """
    for name, value in (("c1", c1), ("c2", c2), ("h", h), ("w", w), ("kernel_size", kernel_size), ("groups", groups)):
        _check_size(value, name)
    if c1 % groups or c2 % groups:
        raise ValueError(f"groups={groups} must divide both c1={c1} and c2={c2}")
    return h * w * (c1 + c2) + kernel_size * kernel_size * c1 * c2 // groups


def conv1x1_memory_access_cost(c1: int, c2: int, h: int, w: int, groups: int = 1) -> int:
    """ShuffleNet V2's MAC of a 1x1 convolution in elements: ``hw(c1 + c2) + c1 c2 / g``.

    Raises:
        TypeError / ValueError: as ``conv_memory_access_cost``.
    """
    return conv_memory_access_cost(c1, c2, h, w, kernel_size=1, groups=groups)


def count_memory_access(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Elements moved by the ``Conv2d`` and ``Linear`` layers of one forward pass, by ShuffleNet V2's model.

    Each such layer reads its input and its weights (and bias) once and writes its output once; the
    sum over layers is the network's MAC in the paper's sense. Element-wise layers (ReLU, additions,
    BatchNorm) are not counted, as in the paper's formula (``count_elementwise_access`` counts those);
    runs as ``count_flops`` does (eval mode, autograd on, one thread; the training flag restored).

    Raises:
        TypeError / ValueError: as ``count_flops``.
    """
    _check_forward_args(module, inputs)
    total = 0

    def hook(layer: nn.Module, args: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += args[0].numel() + output.numel() + sum(p.numel() for p in layer.parameters(recurse=False))

    layers = [m for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with _counting_forward(module):
            module(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return total


@dataclass(frozen=True)
class FlopRanking:
    """How well FLOPs (and MAC) order models by time, every pair read from the same paired rounds.

    A pair (fewer FLOPs, more FLOPs) is *misranked* when the model with fewer FLOPs ran significantly
    slower, *ranked right* when it ran significantly faster, and *unresolved* otherwise.
    """

    rows: tuple[tuple[str, int, int, float], ...]  # (model, FLOPs, MAC, median seconds), by FLOPs
    misranked: tuple[tuple[str, str], ...]
    ranked_right: int
    unresolved: int
    flops_rho: float  # Spearman correlation of the medians with FLOPs (+1: FLOPs order = time order)
    mac_rho: float
    label: str = ""  # the comparison's label (what one timed call was)
    device: str = "-"

    @property
    def pairs(self) -> int:
        return len(self.misranked) + self.ranked_right + self.unresolved

    @property
    def flop_rates(self) -> tuple[float, float]:
        """The slowest and fastest achieved FLOP rate (FLOPs per second of median time) of the models.

        Time proportional to FLOPs would make them equal; their ratio is how far from proportional it is.
        """
        rates = [flops / seconds for _, flops, _, seconds in self.rows]
        return min(rates), max(rates)

    @property
    def summary(self) -> str:
        """The ranking in one line, for a verdict table."""
        low, high = self.flop_rates
        return (
            f"of {self.pairs} pairs: {len(self.misranked)} significantly misranked, {self.ranked_right} "
            f"significantly in FLOP order, {self.unresolved} unresolved; rank correlation of the medians: "
            f"FLOPs {self.flops_rho:.2f}, MAC {self.mac_rho:.2f}; achieved {low / 1e9:.1f}-{high / 1e9:.1f} GFLOP/s "
            f"({high / low:.1f}x apart)"
        )

    def _repr_markdown_(self) -> str:
        body = [[name, f"{f / 1e9:.2f}", f"{m / 1e6:.1f}", format_seconds(t), f"{f / t / 1e9:.1f}"]
                for name, f, m, t in self.rows]  # fmt: skip
        table = markdown_table(["model (by FLOPs)", "GFLOPs", "MAC (M)", "median", "GFLOP/s"], body)
        wrong = "; ".join(f"{a} slower than {b}" for a, b in self.misranked) or "none"
        return f"{table}\n\nMisranked pairs (fewer FLOPs, significantly slower): {wrong}.\n\nIn short: {self.summary}."

    def __repr__(self) -> str:
        return f"FlopRanking({self.summary})"

    def plot(self, axes=None):
        """Two panels, each model's median time against its GFLOPs and against its MAC. Returns the axes."""
        import matplotlib.pyplot as plt

        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
        for ax, column, scale, xlabel in ((axes[0], 1, 1e9, "GFLOPs (2 per multiply-add)"),
                                          (axes[1], 2, 1e6, "MAC of conv/linear layers (M elements)")):  # fmt: skip
            for row in self.rows:
                x, y = row[column] / scale, row[3] * 1e3
                ax.scatter(x, y)
                ax.annotate(row[0], (x, y), fontsize=7)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("median time per call (ms)")
        axes[0].figure.suptitle(f"{self.label} on {self.device}", fontsize=10)
        return axes


def rank_by_flops(comparison: Comparison, flops: Mapping[str, int], mac: Mapping[str, int]) -> FlopRanking:
    """Read every pair of ``comparison``'s variants in FLOP order, and the rank correlations of their medians.

    Args:
        comparison: the models timed interleaved by ``compare`` (every variant a model).
        flops / mac: each variant's FLOPs and memory access, keyed by the variant names.

    Raises:
        KeyError: a variant has no FLOP or MAC count.
        ValueError: fewer than three variants (a rank correlation needs three).
    """
    from scipy.stats import spearmanr

    names = list(comparison.names)
    if len(names) < 3:
        raise ValueError(f"rank_by_flops needs at least 3 timed models, got {len(names)}")
    missing = [n for n in names if n not in flops or n not in mac]
    if missing:
        raise KeyError(f"no FLOP or MAC count for {missing}")
    by_flops = sorted(names, key=lambda n: flops[n])
    pairs = [(a, b) for i, a in enumerate(by_flops) for b in by_flops[i + 1 :]]
    rows = {pair: comparison.versus(*pair) for pair in pairs}
    misranked = tuple(pair for pair, r in rows.items() if r.significant and r.speedup < 1)
    right = sum(r.significant and r.speedup > 1 for r in rows.values())
    medians = [comparison[n].measurement.median for n in names]
    return FlopRanking(
        rows=tuple((n, flops[n], mac[n], comparison[n].measurement.median) for n in by_flops),
        misranked=misranked,
        ranked_right=right,
        unresolved=len(pairs) - len(misranked) - right,
        flops_rho=float(spearmanr([flops[n] for n in names], medians).statistic),
        mac_rho=float(spearmanr([mac[n] for n in names], medians).statistic),
        label=comparison.label,
        device=comparison.device,
    )
