"""The op tracer: a TorchFunctionMode that records every user-level torch call as an ``OpEvent``.

A ``TorchFunctionMode`` sees calls as the user wrote them (``torch.matmul``, ``a * b``,
``F.linear`` inside ``nn.Linear``) before autocast casts their inputs, so an FP32 input that
autocast is about to turn into FP16 inf is still visible. Statistics are cached per tensor
(weakly), so each tensor is reduced once however many ops read it. Backward is observed through
hooks on the autograd nodes of the traced outputs, which ties each gradient to its forward op.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from nan_hunter._nest import leaves, output_leaves
from nan_hunter.fixes.project import is_installed
from nan_hunter.precision.failures import PolicyFailure, policy_failure
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace.events import CapturedCall, GradEvent, OpEvent
from nan_hunter.trace.modules import ModuleTracker
from nan_hunter.trace.source import call_site_name, location_of, project_frame, user_frame
from nan_hunter.trace.stats import TensorStats, tensor_stats

# Ops that only re-view or re-label their input: no arithmetic, so nothing to check.
_VIEW_OPS = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "T", "mT",
        "H", "mH", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten",
        "narrow", "select", "split", "chunk", "unbind", "detach", "movedim", "swapaxes",
        "contiguous", "as_strided", "diagonal", "unfold", "data", "requires_grad_",
    }
)  # fmt: skip


_AUTOCAST_DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def _base_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property such as Tensor.T
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _is_inplace(name: str, kwargs: dict[str, Any]) -> bool:
    if "out" in kwargs:
        return True
    if name.startswith("__"):
        return name.startswith("__i") or name == "__setitem__"
    return name.endswith("_")


class OpTracer(TorchFunctionMode):
    """Records ``OpEvent``s; use ``forward()`` around the forward and ``backward()`` around it."""

    def __init__(
        self,
        modules: ModuleTracker,
        fmt: FloatFormat,
        *,
        count_all: bool = False,
        before_write: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        super().__init__()
        self._before_write = before_write
        """Called with the tensor an in-place op is about to write (to snapshot weights)."""
        self._modules = modules
        self._fmt = fmt
        self._count_all = count_all
        """Count zeros and tiny values in every output, not only in low-precision ones."""
        self.events: list[OpEvent] = []
        self.grad_events: list[GradEvent] = []
        self.first_origin_call: CapturedCall | None = None
        self._stats: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._producer: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._occurrences: Counter[tuple[str, str, int]] = Counter()
        self._nodes: dict[int, tuple[Any, int]] = {}
        self._paused = False
        self.in_loss = False
        """Set by the runner while the loss function runs."""
        self.escaped: set[int] = set()
        """Indices of ops whose output left a module (a module's or the model's output)."""

    # -- forward ---------------------------------------------------------------------------
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        name = _base_name(func)
        flat = list(leaves((args, kwargs)))
        in_tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        if name in _VIEW_OPS:
            out = func(*args, **kwargs)
            self._inherit_producer(out, in_tensors)
            return out
        in_stats = tuple(self.stats_of(t) for t in in_tensors)
        producers = tuple(self._producer.get(t) for t in in_tensors)
        if self._before_write is not None and in_tensors and _is_inplace(name, kwargs):
            written = kwargs.get("out", in_tensors[0])
            for t in written if isinstance(written, (tuple, list)) else (written,):
                if isinstance(t, torch.Tensor):
                    self._before_write(t)
        try:
            out = func(*args, **kwargs)
            failure = None
        except RuntimeError as exc:
            failure = policy_failure(exc)
            if failure is None:
                raise
            # CUDA would stop here; report it and carry on in FP32 so the scan goes on.
            out = _run_in_fp32(func, args, kwargs)
        out_tensors = [x for x in leaves(out) if isinstance(x, torch.Tensor)]
        if _is_inplace(name, kwargs) and in_tensors:
            self._stats.pop(in_tensors[0], None)
            if not out_tensors:  # __setitem__ returns None: the mutated tensor is the output
                out_tensors = [in_tensors[0]]
        if not out_tensors:
            return out
        self._record(func, args, kwargs, flat, in_stats, producers, out_tensors, failure)
        return out

    def _record(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flat: list[Any],
        in_stats: tuple[TensorStats, ...],
        producers: tuple[int | None, ...],
        out_tensors: list[torch.Tensor],
        failure: PolicyFailure | None = None,
    ) -> None:
        frame, in_user_code = user_frame(sys._getframe(2))
        location = location_of(frame) if frame is not None else None
        call_site = None
        if frame is not None and in_user_code and is_installed(frame.f_code.co_filename):
            outer = project_frame(frame)
            call_site = location_of(outer) if outer is not None else None
        op = call_site_name(func, frame if in_user_code else None)
        index = len(self.events)
        out_stats = []
        for t in out_tensors:
            stats = self._summarise(t)
            self._stats[t] = stats
            self._producer[t] = index
            out_stats.append(stats)
        site = (op, location.file if location else "", location.line if location else 0)
        self._occurrences[site] += 1
        event = OpEvent(
            index=index,
            op=op,
            module=self._modules.current,
            location=location,
            in_user_code=in_user_code,
            inputs=in_stats,
            outputs=tuple(out_stats),
            producers=producers,
            scalars=tuple(float(x) for x in flat if type(x) is float),
            key=(*site, self._occurrences[site]),
            in_loss=self.in_loss,
            autocast=any(torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES),
            failure=failure,
            call_site=call_site,
        )
        self.events.append(event)
        if self.first_origin_call is None and event.inputs_finite and not event.outputs_finite:
            self.first_origin_call = CapturedCall(func, *_detached_copy(args, kwargs))
        self._watch_backward(out_tensors, index)

    def stats_of(self, t: torch.Tensor) -> TensorStats:
        stats = self._stats.get(t)
        if stats is None:
            stats = self._summarise(t)
            self._stats[t] = stats
        return stats

    def _summarise(self, t: torch.Tensor, *, counts: bool | None = None) -> TensorStats:
        # Our own reductions bypass dispatch modes (the FP16 emulation): nothing to emulate.
        if counts is None:
            counts = self._count_all or t.dtype == self._fmt.dtype
        if torch._C._len_torch_dispatch_stack() == 0:
            return tensor_stats(t, self._fmt, counts=counts)
        with _disable_current_modes():
            return tensor_stats(t, self._fmt, counts=counts)

    def _inherit_producer(self, out: Any, in_tensors: list[torch.Tensor]) -> None:
        if not in_tensors:
            return
        source = self._producer.get(in_tensors[0])
        if source is None:
            return
        for t in leaves(out):
            if isinstance(t, torch.Tensor):
                self._producer[t] = source

    def mark_escaped(self, output: Any) -> None:
        """Record the producers of a module's output: values the next layer may cast."""
        for t in output_leaves(output):
            if isinstance(t, torch.Tensor):
                index = self._producer.get(t)
                if index is not None:
                    self.escaped.add(index)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run nan-hunter's own tensor code (the default loss) without tracing it."""
        previous, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = previous

    # -- backward --------------------------------------------------------------------------
    def _watch_backward(self, out_tensors: list[torch.Tensor], index: int) -> None:
        for t in out_tensors:
            node = t.grad_fn
            if node is not None and id(node) not in self._nodes:
                self._nodes[id(node)] = (node, index)

    def backward_hooks(self) -> _BackwardHooks:
        return _BackwardHooks(self)

    def _on_node(self, forward_index: int, grad_inputs: Any, grad_outputs: Any) -> None:
        incoming = tuple(self._summarise(g, counts=False) for g in grad_outputs if g is not None)
        produced = tuple(self._summarise(g, counts=False) for g in grad_inputs if g is not None)
        self.grad_events.append(
            GradEvent(len(self.grad_events), forward_index, incoming, produced)
        )


class _BackwardHooks:
    """Installs node hooks on the traced autograd nodes for one backward; removes them after."""

    def __init__(self, tracer: OpTracer) -> None:
        self._tracer = tracer
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> None:
        for node, index in self._tracer._nodes.values():
            self._handles.append(node.register_hook(self._hook_for(index)))

    def _hook_for(self, index: int) -> Callable[[Any, Any], None]:
        tracer = self._tracer

        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            tracer._on_node(index, grad_inputs, grad_outputs)

        return hook

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._tracer._nodes.clear()


def _run_in_fp32(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
            return x.float()
        return x

    with contextlib.ExitStack() as stack:
        for device in _AUTOCAST_DEVICES:
            stack.enter_context(torch.autocast(device_type=device, enabled=False))
        return func(*tree_map(up, args), **tree_map(up, kwargs))


def _detached_copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    def copy(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return tree_map(copy, args), tree_map(copy, kwargs)
