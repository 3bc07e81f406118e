"""One traced forward + loss of the user's model, and backwards on its graph: what a pass runs.

``TracedForward.run`` calls the model's forward and its loss (the user's ``loss_fn``, else
``default_loss``) under the pass's contexts (module tracker, numerics, op tracer, precision,
device queries), each call of the model's inside ``blame.user_errors``; ``backward`` takes the
gradients with ``torch.autograd.grad`` (so the user's ``.grad`` fields are never written) and
returns the ``PassResult``; ``close`` restores the model exactly as it was found (parameters,
buffers, train/eval flags, ``requires_grad``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.core.location import SourceLocation
from nan_hunter.core.nest import output_leaves
from nan_hunter.engine.blame import user_errors
from nan_hunter.engine.model_state import ModelState, cast_model, to_dtype
from nan_hunter.engine.pass_state import RngState
from nan_hunter.errors import UserCodeError
from nan_hunter.precision.compare import OpObserver
from nan_hunter.precision.formats import LOW_PRECISION_DTYPES, FloatFormat
from nan_hunter.precision.gradients import GradientLog, GradRecord
from nan_hunter.precision.heap import trim_heap, trims_paced_by
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.device_queries import CudaQueries
from nan_hunter.trace.events import CapturedCall, GradEvent, OpEvent
from nan_hunter.trace.modules import ModuleTracker
from nan_hunter.trace.stats import TensorStats, finite_flag, stored_values, tensor_stats


@dataclass(frozen=True)
class PassResult:
    events: tuple[OpEvent, ...]
    grad_events: tuple[GradEvent, ...]
    first_origin_call: CapturedCall | None
    loss: TensorStats | None
    backward_ran: bool
    escaped: frozenset[int] = frozenset()
    """Ops whose output left a module: the values a next layer may cast."""
    unseen: tuple[str, ...] = ()
    """Modules whose outputs were computed by ops the tracer did not see (``OpTracer.unseen``):
    nothing checked those ops' values."""
    recomputed: tuple[str, ...] = ()
    """Modules whose forward ran again inside the backward (``OpTracer.recomputed``): a
    reversible layer's or an activation checkpoint's recomputation, not traced op by op."""
    device_queries: tuple[tuple[str, SourceLocation], ...] = ()
    """Where the user's forward asked which device it runs on (``OpTracer.device_queries``):
    what it asked (``".is_cuda"``) and the line."""
    param_grads: dict[str, GradRecord] = field(default_factory=dict)
    """Per parameter name: what FP16 rounding did to its gradient (emulated backward only)."""
    kept: frozenset[str] = frozenset()
    """Half mode: the floating parameters and buffers the model's cast left in FP32 (a module
    that keeps itself in FP32 through its ``_apply``)."""
    gradients_finite: bool | None = None
    """For a backward run without per-node events (``grad_events`` empty) to measure gradients
    (the loss-scale window's): whether every gradient stayed finite (each parameter's, and each
    one the gradient log saw rounded). None for one whose gradients went to the observer."""
    backward_skipped: str = ""
    """Why no backward ran (empty when one did): no backward asked for, no parameter that
    requires a gradient, a loss that does not require one, no parameter the loss reaches."""
    estimated_zeros: bool = False
    """Whether the zero counts of some large FP16 results are estimates (a ``PassRunner`` with
    ``exact_zeros=False``, until ``recount``)."""


def default_loss(output: Any) -> torch.Tensor:
    """Sum of the means of all dense floating-point tensors in ``output`` (any nesting; a sparse
    tensor has no ``mean``)."""
    floats = [
        t for t in output_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    terms = [t.float().mean() for t in floats if t.layout == torch.strided and t.numel() > 0]
    if not terms:
        sparse = any(t.layout != torch.strided for t in floats)
        raise UserCodeError(
            "the model's output holds no floating-point tensor to build a loss from"
            f"{' (a sparse one has no mean)' if sparse else ''}; "
            "define loss_fn(output, batch) in the model file"
        )
    return torch.stack(terms).sum()


class TracedForward:
    """One traced forward + loss, and backwards on its graph; ``close`` restores the model."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch: Batch,
        loss_fn: LossFn | None,
        fmt: FloatFormat,
        numerics: Callable[[GradientLog | None], contextlib.AbstractContextManager[Any]],
        *,
        half: bool,
        fp32: bool = False,
        count_all: bool,
        depth: int | None,
        backward: bool,
        every_histogram: bool = False,
        exact_zeros: bool = True,
        traced: bool = True,
        observer: OpObserver | None = None,
    ) -> None:
        from nan_hunter.trace.op_calls import UntracedOps
        from nan_hunter.trace.tracer import OpTracer

        self._model, self._batch, self._loss_fn, self._fmt = model, batch, loss_fn, fmt
        self._numerics, self._half, self._backward = numerics, half, backward
        self._fp32 = fp32
        self._every_histogram = every_histogram
        self._traced = traced
        """Whether the forward's ops are traced; without, it makes no events, and its graph is
        neither kept nor reused (a later pass needs the events)."""
        self._state = ModelState(model)
        self._modules = ModuleTracker(
            model, on_output=lambda output: self._tracer.mark_escaped(output)
        )
        self._tracer = OpTracer(
            self._modules, fmt, count_all=count_all, before_write=self._state.protect,
            depth=depth, exact_zeros=exact_zeros, observer=observer,
        )  # fmt: skip
        self._observer = observer
        self._ops = self._tracer if traced else UntracedOps(self._state.protect)
        """The forward's function mode: the tracer, or without it what it does besides
        recording (an in-place write to a parameter protected, a refused op replayed in FP32)."""
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._loss: torch.Tensor | None = None
        self._loss_stats: TensorStats | None = None
        self._events: tuple[OpEvent, ...] = ()
        self._kept: frozenset[str] = frozenset()
        self._trimmed = False
        self.rng: RngState | None = None
        """The RNG state the forward started from."""
        self.reusable = False
        """Whether another backward can run on the graph (retained, and nothing failed)."""

    @property
    def output_bytes(self) -> int:
        """Bytes of the traced outputs; -1 when the forward was not traced (never kept)."""
        return self._tracer.output_bytes if self._traced else -1

    @property
    def events(self) -> tuple[OpEvent, ...]:
        """The forward's events (after ``run``)."""
        return self._events

    @property
    def first_origin_call(self) -> CapturedCall | None:
        return self._tracer.first_origin_call

    def run(self, precision: contextlib.AbstractContextManager[Any]) -> None:
        model, batch, tracer, modules = self._model, self._batch, self._tracer, self._modules
        if self._half:
            with user_errors(modules, f"the cast to {self._fmt.name} (model.half())"):
                self._kept = cast_model(model, self._fmt.dtype)
            batch = _batch_to(batch, self._fmt.dtype)
        elif self._fp32:  # FP32 reference: FP16/BF16 weights (a model.half()) and inputs too
            to_dtype(model, torch.float32, only=LOW_PRECISION_DTYPES)
            batch = _batch_to(batch, torch.float32, only=LOW_PRECISION_DTYPES)
        queries = CudaQueries(tracer.note_cuda_query) if self._traced else contextlib.nullcontext()
        with modules, self._numerics(None), self._ops, precision, queries:
            with user_errors(modules, "forward"):
                output = model(*batch.args, **batch.kwargs)
            tracer.in_loss = True
            if self._loss_fn is not None:
                with user_errors(modules, "loss_fn"):
                    loss = self._loss_fn(output, batch.raw)
            else:
                with tracer.paused(), user_errors(modules, "the default loss"):
                    loss = default_loss(output)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise UserCodeError(f"loss_fn must return a scalar tensor, got {_describe(loss)}")
        if loss.is_meta:
            raise UserCodeError(
                "the loss is on the meta device, without values: the model's output (or "
                "loss_fn) moved it there"
            )
        self._loss = loss
        self._loss_stats = tensor_stats(loss.detach(), self._fmt)
        self._events = tuple(tracer.events)

    def backward(
        self,
        scale: float,
        gradients: GradientLog | None,
        *,
        retain: bool,
        events: bool = True,
        observe: bool | None = None,
    ) -> PassResult:
        """A backward from ``loss * scale`` (none if ``backward`` is off or nothing needs a
        gradient); ``retain``: keep the graph for another one; ``events``: trace the backward
        node by node (``grad_events``), else only measure the gradients; ``observe``: hand the
        gradients to the observer (default: ``events``; a pass without events is the
        loss-scale window's, whose gradients are not the ones compared)."""
        if observe is None:
            observe = events
        loss, tracer, modules, params = self._loss, self._tracer, self._modules, self._params
        assert loss is not None
        self.reusable = False
        param_grads: dict[str, GradRecord] = {}
        backward_ran = False
        finite: bool | None = None
        skipped = _why_no_backward(self._backward, params, loss, self._model)
        tracer.begin_backward()
        if self._backward and params and loss.requires_grad:
            if not self._trimmed and loss.device.type == "cpu":
                # The forward's freed temporaries, given back before the gradients need room.
                self._trimmed = trim_heap()
            scaled = loss * scale if scale != 1.0 else loss
            if gradients is not None:
                gradients.watch(params, every=self._every_histogram)
            hooks = tracer.backward_hooks() if events else contextlib.nullcontext()
            weights = sum(p.numel() * p.element_size() for p in params)
            with (
                modules,
                trims_paced_by(weights),
                self._numerics(gradients),
                hooks,
                user_errors(modules, "backward"),
            ):
                grads = torch.autograd.grad(scaled, params, allow_unused=True, retain_graph=retain)
            backward_ran = True
            if observe and self._observer is not None:
                self._observer.on_gradients(grads)
            if all(g is None for g in grads):
                skipped = "no parameter gets a gradient from the loss"
            if gradients is not None:
                gradients.flush()
                param_grads = _param_grads(self._model, params, grads, gradients)
            if not events and not observe:
                finite = _all_finite(grads) and (gradients is None or not gradients.overflowed)
        self.reusable = (retain or not backward_ran) and self._traced
        return PassResult(
            events=self._events,
            grad_events=tuple(tracer.grad_events),
            first_origin_call=tracer.first_origin_call,
            loss=self._loss_stats,
            backward_ran=backward_ran,
            backward_skipped=skipped,
            escaped=frozenset(tracer.escaped),
            unseen=tuple(tracer.unseen) if self._traced else (),
            recomputed=tuple(tracer.recomputed) if self._traced else (),
            device_queries=tuple(tracer.device_queries.values()) if self._traced else (),
            param_grads=param_grads,
            kept=self._kept,
            gradients_finite=finite,
            estimated_zeros=tracer.estimated_zeros,
        )

    def close(self) -> None:
        """Restore the model, and let go of everything the pass held (the graph, the batch, the
        state snapshot) now rather than when the cyclic collector runs: the tracer and its
        statistics queue, the module tracker and its callback refer to each other, and the
        collector runs rarely during a scan, so the next pass (the FP32 reference) would run
        beside a second copy of the buffers and of the batch."""
        self._loss = None
        self._batch = None  # type: ignore[assignment]
        self._tracer.release()
        self._modules.release()
        self._state.restore()


def _all_finite(grads: tuple[torch.Tensor | None, ...]) -> bool:
    """Whether every gradient is finite, one read back: a sum per tensor on a CPU (NaN and inf
    propagate; ``_foreach_norm(inf)`` there took 97 ms over 31.6M values, the sums 6 ms), one
    fused max-magnitude per device on a GPU (``finite_flag``). A sum that overflows FP32 on
    finite values is told apart by an exact check of each tensor, run only then."""
    present = [g for g in grads if g is not None and g.is_floating_point()]
    with torch._C._DisableTorchDispatch():
        flag = finite_flag(present)
        if flag is None or bool(flag):
            return True
        values = [stored_values(g) if g.layout != torch.strided else g.detach() for g in present]
        return all(bool(real.isfinite(v).all()) for v in values)


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


def _batch_to(
    batch: Batch, dtype: torch.dtype, only: frozenset[torch.dtype] | None = None
) -> Batch:
    """The batch's floating tensors (of the dtypes ``only``, when given) in ``dtype``."""
    return batch.map(
        lambda x: x.to(dtype) if x.is_floating_point() and (only is None or x.dtype in only) else x
    )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


NO_PARAMETERS = "the model has no parameters: there is nothing to train"
"""Why no backward ran for a model without parameters (a note, not a finding: NH002)."""


def _why_no_backward(
    asked: bool, params: list[torch.Tensor], loss: torch.Tensor, model: torch.nn.Module
) -> str:
    """Why a backward from ``loss`` cannot analyse anything, or ``""`` when it can run."""
    if not asked:
        return "no backward was asked for (--no-backward)"
    if not params:
        if next(model.parameters(), None) is None:
            return NO_PARAMETERS
        return "no parameter of the model requires a gradient"
    if not loss.requires_grad:
        return (
            "the loss does not require a gradient: it is detached from every parameter "
            "(a .detach(), .item() or torch.no_grad() inside the model or loss_fn)"
        )
    return ""
