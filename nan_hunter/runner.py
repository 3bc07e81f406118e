"""Runs the user's model once (forward, loss, backward) under a precision setting, traced.

The model is left exactly as it was found: parameters, buffers, ``.grad``, train/eval flags and
``requires_grad`` are restored in ``finally``. Gradients are taken with ``torch.autograd.grad``,
so the user's ``.grad`` fields are never written in the first place.
"""

from __future__ import annotations

import contextlib
import gc
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from nan_hunter._nest import output_leaves
from nan_hunter.batch import Batch, LossFn
from nan_hunter.errors import UserCodeError, first_line
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import GradientLog, GradRecord
from nan_hunter.trace.deferred import StaleStatistics
from nan_hunter.trace.events import CapturedCall, GradEvent, OpEvent
from nan_hunter.trace.modules import ModuleTracker
from nan_hunter.trace.source import frame_origin
from nan_hunter.trace.stats import TensorStats, tensor_stats


@dataclass(frozen=True)
class PassResult:
    events: tuple[OpEvent, ...]
    grad_events: tuple[GradEvent, ...]
    first_origin_call: CapturedCall | None
    loss: TensorStats | None
    backward_ran: bool
    escaped: frozenset[int] = frozenset()
    """Ops whose output left a module: the values a next layer may cast."""
    param_grads: dict[str, GradRecord] = field(default_factory=dict)
    """Per parameter name: what FP16 rounding did to its gradient (emulated backward only)."""


class ModelState:
    """A snapshot of everything a forward/backward can change in a model, and its restore.

    Buffers (BatchNorm statistics, which kernels update in place) are copied up front.
    Parameters are copied lazily: the tracer calls ``protect`` before any in-place op on a
    tensor that shares a parameter's storage (``p.add_``, ``p.data.clamp_``), so a scan costs
    no second copy of the weights. On restore, what was written to (version counter moved, or
    protected) or swapped for a half-precision copy is put back.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        with torch.no_grad():
            self._buffers = [(b, b.data, b._version, b.detach().clone()) for b in model.buffers()]
        self._params = [(p, p.data, p._version) for p in model.parameters()]
        self._data_versions = [data._version for _, data, _ in self._params]
        # Which tensor each module holds under each name: forward may rebind a buffer
        # (``self.running = 0.9 * self.running + ...``); the original object is put back.
        self._slots = [
            (slots, name, tensor)
            for m in model.modules()
            for slots in (m._buffers, m._parameters)
            for name, tensor in slots.items()
        ]
        self._storages = {_storage(p): p for p in model.parameters()}
        self._saved: dict[int, torch.Tensor] = {}
        self._grads = [(p, p.grad) for p in model.parameters()]
        self._requires_grad = [(p, p.requires_grad) for p in model.parameters()]
        self._training = [(m, m.training) for m in model.modules()]

    def protect(self, tensor: torch.Tensor) -> None:
        """Copy the parameter whose storage ``tensor`` shares, before it is written to."""
        key = _storage(tensor)
        param = self._storages.get(key)
        if param is not None and key not in self._saved:
            with torch.no_grad():
                self._saved[key] = param.detach().clone()

    def restore(self) -> None:
        with torch.no_grad():
            for slots, name, tensor in self._slots:
                if slots.get(name) is not tensor:
                    slots[name] = tensor
            for live, data, version, saved in self._buffers:
                if live.data is not data:  # converted for a half-precision pass
                    live.data = data
                if live._version != version or data._version != version:
                    data.copy_(saved)
            unrestorable = []
            for (p, data, version), data_version in zip(
                self._params, self._data_versions, strict=True
            ):
                # Swapped for a half-precision copy: in-place writes went to the copy.
                swapped = p.dtype != data.dtype or p.data_ptr() != data.data_ptr()
                if p.data is not data:
                    p.data = data
                copy = self._saved.get(_storage(data))
                if copy is not None:
                    data.copy_(copy)
                elif (data._version != data_version) if swapped else (p._version != version):
                    unrestorable.append(p)
        for p, grad in self._grads:
            p.grad = grad
        for p, flag in self._requires_grad:
            p.requires_grad_(flag)
        for m, flag in self._training:
            m.train(flag)
        if unrestorable:
            names = {id(p): n for n, p in self._model.named_parameters()}
            raise UserCodeError(
                "the model wrote to its parameters in place, out of nan-hunter's sight "
                f"({', '.join(names.get(id(p), '?') for p in unrestorable)}); they cannot be "
                "restored"
            )


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def default_loss(output: Any) -> torch.Tensor:
    """Sum of the means of all floating-point tensors in ``output`` (any nesting)."""
    terms = [
        t.float().mean()
        for t in output_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0
    ]
    if not terms:
        raise UserCodeError(
            "the model's output holds no floating-point tensor to build a loss from; "
            "define loss_fn(output, batch) in the model file"
        )
    return torch.stack(terms).sum()


def run_pass(
    model: torch.nn.Module,
    batch: Batch,
    loss_fn: LossFn | None,
    precision: contextlib.AbstractContextManager[Any],
    fmt: FloatFormat,
    *,
    backward: bool,
    numerics: contextlib.AbstractContextManager[Any] | None = None,
    half: bool = False,
    grad_scale: float = 1.0,
    gradients: GradientLog | None = None,
    count_all: bool = False,
) -> PassResult:
    """One traced forward + loss (+ backward) of ``model`` on ``batch``.

    ``precision`` wraps forward and loss (autocast and its policy), ``numerics`` wraps forward
    and backward (the FP16 emulation); ``half`` runs model and batch in ``fmt``'s dtype. The
    backward starts from ``loss * grad_scale``, as ``GradScaler.scale(loss)`` does; ``gradients``
    is the log ``numerics`` fills during it (per-parameter underflow is read from it).

    Statistics are read back in batches; if the model wrote to a waiting tensor out of the
    tracer's sight (``StaleStatistics``), the pass runs again, RNG state rewound, reading every
    tensor back as it is seen.
    """
    rng = _rng_state()
    again_precision, again_numerics = _recreator(precision), _recreator(numerics)
    options: dict[str, Any] = {
        "backward": backward, "half": half, "grad_scale": grad_scale, "gradients": gradients,
        "count_all": count_all,
    }  # fmt: skip
    try:
        with fewer_collections():
            return _run_pass(model, batch, loss_fn, precision, fmt, numerics, **options)
    except StaleStatistics:
        torch.random.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
        if gradients is not None:
            gradients.reset(depth=1)
        with fewer_collections():
            return _run_pass(
                model, batch, loss_fn, again_precision(), fmt, again_numerics(), depth=0, **options
            )


GC_THRESHOLD = 100_000
"""Allocations between two young-generation collections during a pass (Python's default: 700).
A pass creates a few Python objects per op that all live to its end; with the default, the
collector walks them again and again (a fifth of an op-heavy scan's time). Cycles are still
collected, a hundred times less often."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the cyclic garbage collector's first threshold for the duration of a pass."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def _recreator(
    context: contextlib.AbstractContextManager[Any] | None,
) -> Callable[[], contextlib.AbstractContextManager[Any] | None]:
    """Makes ``context`` anew for a second pass: ``@contextmanager`` ones are single-use (and
    forget their function once entered, so it is taken now)."""
    func = getattr(context, "func", None)
    if isinstance(context, contextlib._GeneratorContextManager) and func is not None:
        args, kwds, kind = context.args, context.kwds, type(context)
        return lambda: kind(func, args, kwds)
    return lambda: context


def _run_pass(
    model: torch.nn.Module,
    batch: Batch,
    loss_fn: LossFn | None,
    precision: contextlib.AbstractContextManager[Any],
    fmt: FloatFormat,
    numerics: contextlib.AbstractContextManager[Any] | None,
    *,
    backward: bool,
    half: bool,
    grad_scale: float,
    gradients: GradientLog | None,
    count_all: bool,
    depth: int | None = None,
) -> PassResult:
    from nan_hunter.trace.tracer import OpTracer

    state = ModelState(model)
    modules = ModuleTracker(model, on_output=lambda output: tracer.mark_escaped(output))
    tracer = OpTracer(
        modules, fmt, count_all=count_all, before_write=state.protect, depth=depth
    )
    params = [p for p in model.parameters() if p.requires_grad]
    backward_ran = False
    try:
        if half:
            _to_dtype(model, fmt.dtype)
            batch = _batch_to(batch, fmt.dtype)
        with modules, numerics or contextlib.nullcontext():
            with tracer, precision:
                with _user_errors(modules, "forward"):
                    output = model(*batch.args, **batch.kwargs)
                tracer.in_loss = True
                if loss_fn is not None:
                    with _user_errors(modules, "loss_fn"):
                        loss = loss_fn(output, batch.raw)
                else:
                    with tracer.paused():
                        loss = default_loss(output)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise UserCodeError(f"loss_fn must return a scalar tensor, got {_describe(loss)}")
            loss_stats = tensor_stats(loss.detach(), fmt)
            param_grads: dict[str, GradRecord] = {}
            if backward and params and loss.requires_grad:
                scaled = loss * grad_scale if grad_scale != 1.0 else loss
                if gradients is not None:
                    gradients.watch(_gradient_sizes(params))
                with tracer.backward_hooks(), _user_errors(modules, "backward"):
                    grads = torch.autograd.grad(scaled, params, allow_unused=True)
                backward_ran = True
                if gradients is not None:
                    gradients.flush()
                    param_grads = _param_grads(model, params, grads, gradients)
        return PassResult(
            events=tuple(tracer.events),
            grad_events=tuple(tracer.grad_events),
            first_origin_call=tracer.first_origin_call,
            loss=loss_stats,
            backward_ran=backward_ran,
            escaped=frozenset(tracer.escaped),
            param_grads=param_grads,
        )
    finally:
        state.restore()


def _gradient_sizes(params: list[torch.nn.Parameter]) -> set[int]:
    return {p.numel() for p in params}


def _param_grads(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    grads: tuple[torch.Tensor | None, ...],
    gradients: GradientLog,
) -> dict[str, GradRecord]:
    names = {id(p): n for n, p in model.named_parameters()}
    records = gradients.records_of(list(grads))
    return {
        names[id(p)]: record
        for p, record in zip(params, records, strict=True)
        if record is not None
    }


def _to_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers to ``dtype`` in place (``ModelState`` restores them)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.data = t.data.to(dtype)


def _batch_to(batch: Batch, dtype: torch.dtype) -> Batch:
    return batch.map(lambda x: x.to(dtype) if x.is_floating_point() else x)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


@contextlib.contextmanager
def _user_errors(modules: ModuleTracker, phase: str) -> Iterator[None]:
    """Re-raise an exception from the user's code with its frame and the modules executed."""
    try:
        yield
    except (UserCodeError, StaleStatistics):
        raise
    except Exception as exc:
        frame = _last_user_frame(exc)
        where = f" in module '{modules.current}'" if modules.current else ""
        executed = ", ".join(repr(m) for m in modules.executed[-3:])
        context = f"; executed modules up to {executed}" if executed else ""
        modules.reset()
        raise UserCodeError(
            f"the model raised {type(exc).__name__} during {phase}{where}: "
            f"{first_line(exc)}{context}",
            user_frame=frame,
        ) from exc


def _last_user_frame(exc: BaseException) -> str | None:
    """``file:line`` of the innermost traceback frame in the user's own code."""
    found = None
    for summary in traceback.extract_tb(exc.__traceback__):
        if frame_origin(summary.filename) == "user":
            found = f"{summary.filename}:{summary.lineno}"
    return found
