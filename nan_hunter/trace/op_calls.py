"""What an op call goes through besides its recording: the names that tell a view or an
in-place write, the snapshot of a tensor about to be written, and the FP32 replay of an op
CUDA's autocast refuses (``call_or_replay``). ``OpTracer`` records around these;
``UntracedOps`` is them alone, for a forward that is not traced.

Our own work here (naming, protecting, reading a refusal, casting a replay's result) raises
``InternalError`` on failure; the op itself, and its replay, are passed on as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from nan_hunter.core.nest import call_leaves
from nan_hunter.errors import OURS_AS_THEY_ARE, InternalError, UnsupportedError, ours
from nan_hunter.precision.failures import PolicyFailure, policy_failure
from nan_hunter.precision.replay import replay_in_fp32
from nan_hunter.trace.call_sites import frame_origin

VIEW_OPS = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "T", "mT",
        "H", "mH", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten",
        "narrow", "select", "split", "chunk", "unbind", "detach", "movedim", "swapaxes",
        "contiguous", "as_strided", "diagonal", "unfold", "data", "requires_grad_",
    }
)  # fmt: skip
"""Ops that only re-view or re-label their input: no arithmetic, so nothing to check."""


ALLOCATIONS = frozenset(
    {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
)
"""Ops that return memory no op wrote: what it holds (NaN, inf, subnormals from whatever used
the memory before) is not data, and an allocation is never an origin."""

OVERWRITES = frozenset(
    {
        "copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_",
        "exponential_", "geometric_", "cauchy_", "log_normal_",
    }
)  # fmt: skip
"""In-place ops that write every element of the tensor they are called on without reading it
(as does any op's ``out=``): after them, an allocation holds data."""

PARTIAL_WRITES = frozenset(
    {
        "__setitem__", "index_put_", "index_copy_", "index_fill_", "masked_fill_",
        "masked_scatter_", "scatter_", "put_", "fill_diagonal_",
    }
)  # fmt: skip
"""In-place ops that write some elements of the tensor without reading the others: an
allocation written by them may still hold memory no op wrote."""


def written_tensors(kwargs: dict[str, Any], in_tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors an in-place op writes: ``out=``, else its first input."""
    written = kwargs.get("out", in_tensors[0])
    return [
        t for t in (written if isinstance(written, (tuple, list)) else (written,))
        if isinstance(t, torch.Tensor)
    ]


def base_name(func: Callable[..., Any]) -> str:
    """The name of a torch function as the user called it (``T`` for the property; ``detach``
    for ``torch.ops.aten.detach.default``, which torch's own Python calls around a custom
    ``autograd.Function`` while a dispatch mode runs)."""
    if isinstance(func, torch._ops.OpOverload):
        return func._opname
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property such as Tensor.T
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def is_inplace(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether the call writes a tensor (``out=``, ``x.add_``, ``x += y``, ``x[i] = y``)."""
    if "out" in kwargs:
        return True
    if name.startswith("__"):
        return name.startswith("__i") or name == "__setitem__"
    return name.endswith("_")


def protect_written(
    before_write: Callable[[torch.Tensor], None],
    kwargs: dict[str, Any],
    in_tensors: list[torch.Tensor],
) -> None:
    """Hands the tensors an in-place op is about to write (``out=``, else its first input) to
    ``before_write``."""
    for t in written_tensors(kwargs, in_tensors):
        before_write(t)


def call_or_replay(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, PolicyFailure | None]:
    """``func(*args, **kwargs)``, and None; for an op CUDA's autocast refuses, where CUDA would
    stop, the op run again in FP32 (so the scan goes on), and the refusal to report."""
    try:
        return func(*args, **kwargs), None
    except RuntimeError as exc:
        failure = ours(policy_failure)(exc)  # ours, between the op and its replay
        if failure is None:
            raise
        result = replay_in_fp32(func, args, kwargs)
        if failure.kind == "scalar_overflow":
            result = ours(_as_written)(result, args)
        return result, failure


def _as_written(result: Any, args: tuple[Any, ...]) -> Any:
    """A constant too large for the tensor it goes into (``masked_fill(m, -1e9)`` on FP16): the
    FP32 replay's result in the tensor's own dtype (``-inf`` where the constant went), which
    is what the model's next ops would compute with had the op saturated; an FP32 result
    would meet the next FP16 op as a dtype error of ours."""
    dtype = next(
        (a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None
    )
    if dtype is None:
        return result
    return tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
        result,
    )


class UntracedOps(TorchFunctionMode):
    """What ``OpTracer`` does to a call besides recording it, for a forward that is not traced
    (a loss-scale window's pass): the tensor an in-place op is about to write goes to
    ``before_write`` first (``ModelState.protect``: a parameter written in forward is restored
    after the pass), and an op CUDA's autocast stops runs again in FP32, so the pass goes on
    as the traced one did."""

    def __init__(self, before_write: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self._before_write = before_write

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        try:
            name = base_name(func)
            if name not in VIEW_OPS and is_inplace(name, kwargs):
                in_tensors = [x for x in call_leaves(args, kwargs) if isinstance(x, torch.Tensor)]
                if in_tensors:
                    protect_written(self._before_write, kwargs, in_tensors)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc
        return call_or_replay(func, args, kwargs)[0]


def refuse_nested(op: str, module: str) -> NoReturn:
    """Raised where an op returned a nested tensor, naming the innermost line of the user's
    code on the stack (the op may run inside torch's Python, or under our own call of it)."""
    frame = sys._getframe(1)
    while frame is not None and frame_origin(frame.f_code.co_filename) != "user":
        frame = frame.f_back  # type: ignore[assignment]
    where = f" in module '{module}'" if module else ""
    at = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
    raise UnsupportedError(
        f"{op}{where}{at} returned a nested tensor (torch.nested): nan-hunter scans dense "
        "tensors only; scan the model on padded ones (nested.to_padded_tensor(0.0))"
    )


def detached_copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A call's arguments with each tensor detached and copied (to call it again later)."""

    def copy(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return tree_map(copy, args), tree_map(copy, kwargs)
