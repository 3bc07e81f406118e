"""The FLOPs of a matmul or convolution call, from its operands' shapes.

    >>> a, b = torch.ones(8, 16), torch.ones(16, 4)
    >>> matmul_flops("matmul", (a, b), {}, [a @ b])
    1024

One multiply-add counts two FLOPs, as in ``torch.utils.flop_counter`` (whose formulas these
are, taken at the level the tracer sees: the call the user made, ``F.linear``, ``torch.einsum``,
``F.scaled_dot_product_attention``, not the aten kernels they become). Every other op counts
0 here: its work is the values it writes (``nan_hunter.precision.work``). One handler per op
name, in one registry filled by a decorator that refuses a name twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

Handler = Callable[[tuple[Any, ...], dict[str, Any], Sequence[torch.Tensor]], int]
_HANDLERS: dict[str, Handler] = {}


def _register(*names: str) -> Callable[[Handler], Handler]:
    def add(handler: Handler) -> Handler:
        for name in names:
            if name in _HANDLERS:
                raise ValueError(f"two FLOP formulas for {name}")
            _HANDLERS[name] = handler
        return handler

    return add


def matmul_flops(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: Sequence[torch.Tensor]
) -> int:
    """The FLOPs of the call ``name(*args, **kwargs)`` that returned ``outputs`` (0: not a
    matmul or convolution, or operands it cannot read)."""
    handler = _HANDLERS.get(name)
    if handler is None or not outputs:
        return 0
    try:
        return int(handler(args, kwargs, outputs))
    except (IndexError, TypeError, ValueError, AttributeError):
        return 0  # an unusual call form: counted as no matmul rather than guessed


def _tensors(args: Sequence[Any]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def _contracted(left: torch.Tensor, out: torch.Tensor) -> int:
    """2 x the output's values x the contracted dimension (the left operand's last)."""
    return 2 * out.numel() * (left.shape[-1] if left.dim() else 1)


@_register("matmul", "mm", "bmm", "__matmul__", "linear", "inner", "dot", "vdot", "mv")
def _matmul(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    left = _tensors(args)[0] if _tensors(args) else kwargs["input"]
    return _contracted(left, out[0])


@_register("__rmatmul__")
def _rmatmul(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    return _contracted(_tensors(args)[1], out[0])


@_register("addmm", "baddbmm", "addbmm", "addmv")
def _addmm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    left = _tensors(args)[1]  # (input, mat1, mat2): mat1's last dimension is contracted
    values = out[0].numel()
    if _tensors(args)[1].dim() == 3 and out[0].dim() == 2:  # addbmm sums over the batch
        values *= left.shape[0]
    return 2 * values * left.shape[-1]


@_register("einsum")
def _einsum(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    equation = args[0]
    operands = list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if not isinstance(equation, str) or len(operands) < 2:
        return 0  # one operand: a sum, a trace, a permutation, not a matmul
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for spec, t in zip(inputs, operands, strict=True):
        letters = spec.replace("...", "")
        ellipsis = t.dim() - len(letters)
        if "..." in spec:
            before = spec.index("...")
            for i in range(ellipsis):  # the broadcast dimensions, named apart
                sizes[f"...{i}"] = max(sizes.get(f"...{i}", 1), t.shape[before + i])
            shape = [*t.shape[:before], *t.shape[before + ellipsis :]]
        else:
            shape = list(t.shape)
        for letter, size in zip(letters, shape, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), size)
    return 2 * math.prod(sizes.values()) * (len(operands) - 1)


@_register("conv1d", "conv2d", "conv3d", "convolution", "_convolution")
def _conv(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    weight = _tensors(args)[1] if len(_tensors(args)) > 1 else kwargs["weight"]
    # each output value: in_channels / groups x kernel multiply-adds
    return 2 * out[0].numel() * math.prod(weight.shape[1:])


@_register("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def _conv_transpose(
    args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]
) -> int:
    x, weight = _tensors(args)[:2]
    # each input value is spread over out_channels / groups x kernel outputs
    return 2 * x.numel() * math.prod(weight.shape[1:])


@_register("scaled_dot_product_attention")
def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], out: Sequence[torch.Tensor]) -> int:
    q, k, v = _tensors(args)[:3]
    rows = math.prod(q.shape[:-1])  # batch x heads x queries
    return 2 * rows * k.shape[-2] * (q.shape[-1] + v.shape[-1])


MATMUL_OPS = frozenset(_HANDLERS)
"""The op names whose FLOPs are counted (matmuls, convolutions, attention)."""
