"""Which autograd node is running, and whether the gradient it produces reaches a parameter's
gradient unchanged: how the gradient log tells the gradients it must measure in full."""

from __future__ import annotations

import torch

_current_node = getattr(torch._C, "_current_autograd_node", None)
"""The autograd node whose backward is running (torch >= 2.1); without it every gradient of a
parameter's size gets its histogram."""


def current_node() -> object | None:
    """The autograd node whose backward is running; None outside one (or on torch < 2.1)."""
    return _current_node() if _current_node is not None else None


_PASS_THROUGH = frozenset(
    {
        "ToCopyBackward", "TBackward", "TransposeBackward", "PermuteBackward", "ViewBackward",
        "UnsafeViewBackward", "ReshapeAliasBackward", "AliasBackward", "SqueezeBackward",
        "UnsqueezeBackward", "CloneBackward", "DetachBackward", "BackwardHookFunctionBackward",
    }
)  # fmt: skip
"""Nodes that hand the gradient on as it is (cast, viewed or copied, the values unchanged); a
custom ``autograd.Function``'s node (``<Name>Backward``, a ``BackwardCFunction``) is counted
among them, as it may."""

_CUSTOM_FUNCTION = torch.autograd.function.BackwardCFunction


def feeds_parameter(node: object, params: set[int], low: torch.dtype, depth: int = 8) -> bool:
    """Whether a gradient ``node`` produces can reach a watched parameter's ``AccumulateGrad``
    unchanged, at most ``depth`` nodes on: through ``_PASS_THROUGH`` nodes, custom functions,
    and nodes whose gradients are not in the ``low`` dtype (an FP32 op's backward is not
    emulated, and its result keeps the record of the gradient it was computed from: ``w * 1.0``
    under autocast). Any other node computes a new gradient, rounded, and measured, where that
    node runs. Breadth first, each node once: a multi-input node (a hooked module's) is listed
    once per input."""
    frontier, seen = [node], set()
    for level in range(depth + 1):
        following = []
        for current in frontier:
            for fn, _ in getattr(current, "next_functions", ()):
                if fn is None or fn in seen:
                    continue
                seen.add(fn)
                name = type(fn).__name__
                if name == "AccumulateGrad":
                    if id(getattr(fn, "variable", None)) in params:
                        return True
                elif level < depth and _hands_on(fn, name, low):
                    following.append(fn)
        frontier = following
    return False


def _hands_on(node: object, name: str, low: torch.dtype) -> bool:
    """Whether ``node`` may hand a rounded gradient's record on (see ``feeds_parameter``)."""
    if name.rstrip("0123456789") in _PASS_THROUGH or isinstance(node, _CUSTOM_FUNCTION):
        return True
    metadata = getattr(node, "_input_metadata", None)  # torch >= 2.1
    return bool(metadata) and all(m.dtype != low for m in metadata)
