"""``feeds_parameter`` walks each autograd node once, not once per path to it.

A multi-input module with a full backward hook puts one ``BackwardHookFunctionBackward`` node
on its inputs, listed once per input in the next node's ``next_functions``. Modules nested ``k``
deep with ``n`` tensor inputs each would make a walk that revisits nodes visit ``n ** min(k, 8)``
nodes per rounded gradient of a parameter's size: 4 inputs, 8 levels: 87,000 calls for one
gradient; 6 inputs: a 0.02 s pass takes 2.4 s (4 million calls).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.precision import gradients


class _Innermost(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.node: object = None

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        product = xs[0] @ xs[1]
        self.node = product.grad_fn  # its next functions: the hooks on this module's inputs
        return (product + xs[2] @ xs[3]) @ self.w


class _Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.inner(*xs)


def test_each_node_is_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    innermost = _Innermost()
    model: nn.Module = innermost
    for _ in range(8):
        model = _Wrapper(model)
    for module in model.modules():
        module.register_full_backward_hook(lambda *_: None)
    source = nn.Linear(8, 8)
    h = source(torch.randn(8, 8))
    model(h, h * 2, h * 3, h * 4)

    calls = 0
    walk = gradients.feeds_parameter

    def counted(node: object, params: set[int], low: torch.dtype, depth: int = 8) -> bool:
        nonlocal calls
        calls += 1
        return walk(node, params, low, depth)

    monkeypatch.setattr(gradients, "feeds_parameter", counted)
    # ``source.weight`` lies behind the products (not pass-through): not fed, the walk is whole.
    # The graph is FP32, named the low dtype here: no node hands a record on for its dtype.
    assert not gradients.feeds_parameter(innermost.node, {id(source.weight)}, torch.float32)
    nodes = 2 + 9 * 4  # the hook nodes and what they lead to, generously
    assert calls <= nodes, calls


def test_a_node_that_rounds_several_gradients_is_walked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An addmm's backward rounds three gradients of a parameter's size (bias-sized sum, input
    and weight mms, all 16 values here): one walk from its node answers for the three, and the
    log lets go of the node when it is read."""
    from nan_hunter.precision.emulation import LowPrecisionEmulation
    from nan_hunter.precision.formats import FP16

    walks: list[object] = []
    real = gradients.feeds_parameter

    def counted(node: object, *args: object, **kwargs: object) -> bool:
        walks.append(node)
        return real(node, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gradients, "feeds_parameter", counted)
    linear = nn.Linear(4, 4)
    x = torch.randn(4, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = linear(x).float().sum()
    log = gradients.GradientLog(FP16)
    log.watch(list(linear.parameters()))
    with LowPrecisionEmulation(gradients=log):
        grads = torch.autograd.grad(loss, [*linear.parameters(), x])
    assert len(walks) == 1 and type(walks[0]).__name__ == "AddmmBackward0"
    records = log.records_of(list(grads[:2]))
    assert all(r is not None for r in records)
    assert log._node is None
