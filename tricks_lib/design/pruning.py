"""Structured channel pruning that really shrinks the layers, written out by slicing.

Unstructured pruning (``torch.nn.utils.prune``) zeroes single weights: the tensors keep their shape,
so a dense kernel does the same work as before. Structured pruning removes whole output channels of
a convolution, and with them the matching input channels of the next layer and the BatchNorm
entries in between: the layers get smaller, and so do their FLOPs.

``prune_conv_channels(model, fraction)`` does that for a plain chain of convolutions (each
``Conv2d`` feeding the next, an optional ``BatchNorm2d`` after each, then global pooling and one
``Linear`` head), such as ``tricks_lib.training.models.SmallCNN``. In every convolution it keeps the output
channels with the largest L1 norm of their filters (Li et al. 2017, "Pruning Filters for Efficient
ConvNets"). The ``torch-pruning`` package (Fang et al. 2023, DepGraph) does the same for arbitrary
graphs by tracing the dependencies between layers; the notebook compares the two.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

__all__ = ["kept_channel_counts", "prune_conv_channels"]


def kept_channel_counts(channels: tuple[int, ...], fraction: float) -> tuple[int, ...]:
    """Channels left per layer after removing ``fraction`` of each (rounded, at least one)."""
    return tuple(max(1, round(c * (1 - fraction))) for c in channels)


def _chain(model: nn.Module) -> tuple[list[nn.Conv2d], list[nn.BatchNorm2d], nn.Linear]:
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not convs or len(heads) != 1:
        raise ValueError("prune_conv_channels needs a chain of Conv2d layers and exactly one Linear head")
    if norms and len(norms) != len(convs):
        raise ValueError("prune_conv_channels needs one BatchNorm2d after every Conv2d, or none at all")
    for i, conv in enumerate(convs):
        if conv.groups != 1:
            raise ValueError(f"conv {i} has groups={conv.groups}: only dense convolutions can be sliced here")
        if norms and norms[i].num_features != conv.out_channels:
            raise ValueError(f"BatchNorm {i} does not match conv {i}'s {conv.out_channels} channels")
        if i + 1 < len(convs) and convs[i + 1].in_channels != conv.out_channels:
            raise ValueError(f"conv {i + 1} does not read conv {i}'s output: the layers are not a plain chain")
    if heads[0].in_features != convs[-1].out_channels:
        raise ValueError("the Linear head must read the last conv's channels (after global pooling)")
    return convs, norms, heads[0]


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)
                return
    raise AssertionError("module to replace was not found")  # _chain found it in the same model


def _sliced_conv(conv: nn.Conv2d, keep_in: torch.Tensor, keep_out: torch.Tensor) -> nn.Conv2d:
    new = nn.Conv2d(
        len(keep_in),
        len(keep_out),
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )
    new.weight.copy_(conv.weight[keep_out][:, keep_in])
    if conv.bias is not None:
        new.bias.copy_(conv.bias[keep_out])
    return new


def _sliced_norm(norm: nn.BatchNorm2d, keep: torch.Tensor) -> nn.BatchNorm2d:
    new = nn.BatchNorm2d(len(keep), eps=norm.eps, momentum=norm.momentum, affine=norm.affine)
    if norm.affine:
        new.weight.copy_(norm.weight[keep])
        new.bias.copy_(norm.bias[keep])
    if norm.track_running_stats:
        new.running_mean.copy_(norm.running_mean[keep])
        new.running_var.copy_(norm.running_var[keep])
        new.num_batches_tracked.copy_(norm.num_batches_tracked)
    return new


@torch.no_grad()
def prune_conv_channels(model: nn.Module, fraction: float) -> nn.Module:
    """A copy of ``model`` with ``fraction`` of every convolution's output channels removed.

    Channels with the smallest L1 filter norm go; the next layer loses the matching input channels
    (the BatchNorm in between its entries, the ``Linear`` head its columns). The input channels of
    the first convolution and the head's outputs stay. ``model`` itself is not changed.

    Args:
        model: a plain conv chain (see the module docstring), e.g. ``SmallCNN``.
        fraction: share of each convolution's output channels to remove, in ``[0, 1)``.

    Returns:
        The pruned copy, in the training mode of ``model``.

    Raises:
        TypeError: ``model`` is not a module or ``fraction`` not a number.
        ValueError: ``fraction`` outside ``[0, 1)``, or a model that is not a plain conv chain.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a number, got {fraction!r}")
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise ValueError(f"fraction is the share of channels to remove and must lie in [0, 1), got {fraction!r}")
    pruned = copy.deepcopy(model)
    convs, norms, head = _chain(pruned)
    counts = kept_channel_counts(tuple(c.out_channels for c in convs), fraction)
    keep_in = torch.arange(convs[0].in_channels)
    for i, (conv, n_keep) in enumerate(zip(convs, counts)):
        importance = conv.weight.abs().sum(dim=(1, 2, 3))  # (out_channels,) L1 norm of each filter
        keep_out = torch.sort(torch.topk(importance, n_keep).indices).values
        new_conv = _sliced_conv(conv, keep_in, keep_out).to(conv.weight.device, conv.weight.dtype)
        _replace(pruned, conv, new_conv)
        if norms:
            _replace(pruned, norms[i], _sliced_norm(norms[i], keep_out).to(conv.weight.device))
        keep_in = keep_out
    new_head = nn.Linear(len(keep_in), head.out_features, bias=head.bias is not None)
    new_head.weight.copy_(head.weight[:, keep_in])
    if head.bias is not None:
        new_head.bias.copy_(head.bias)
    _replace(pruned, head, new_head.to(head.weight.device, head.weight.dtype))
    return pruned.train(model.training)
