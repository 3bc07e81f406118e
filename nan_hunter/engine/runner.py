"""Runs the user's model once (forward, loss, backward) under a precision setting, traced:
``run_pass`` for one pass, ``PassRunner`` for passes at several loss scales on one forward.

One traced forward and its backwards: ``traced_forward``; when a pass runs again and how:
``pass_retry``; the process state a pass sets and rewinds: ``pass_state``. The model is left
exactly as it was found (``TracedForward.close``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.engine.pass_retry import RETRIED, RETRIED_ON_A_KEPT_GRAPH, RetryPolicy
from nan_hunter.engine.pass_state import (
    RngState,
    fewer_collections,
    first_then_anew,
    rng_state,
    set_rng_state,
)
from nan_hunter.engine.traced_forward import PassResult, TracedForward
from nan_hunter.precision.compare import OpObserver
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import GradientLog
from nan_hunter.trace.deferred import StaleStatistics

__all__ = ["RETAIN_BYTES", "PassResult", "PassRunner", "run_pass"]


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
    fp32: bool = False,
    grad_scale: float = 1.0,
    gradients: GradientLog | None = None,
    count_all: bool = False,
    observer: OpObserver | None = None,
    grad_events: bool = True,
) -> PassResult:
    """One traced forward + loss (+ backward) of ``model`` on ``batch``.

    ``precision`` wraps forward and loss (autocast and its policy), ``numerics`` wraps forward
    and backward (the FP16 emulation); ``half`` runs model and batch in ``fmt``'s dtype, ``fp32``
    runs their FP16/BF16 tensors in FP32 (the reference pass of a model already in ``.half()``). The
    backward starts from ``loss * grad_scale``, as ``GradScaler.scale(loss)`` does; ``gradients``
    is the log ``numerics`` fills during it (per-parameter underflow is read from it);
    ``observer`` is told each traced op's tensors and the gradients (the precision check);
    ``grad_events``: trace the backward node by node (without, only the gradients are taken:
    what the precision check's gradient cosine needs, when no backward origin is analysed).

    Statistics are read back in batches; if the model wrote to a waiting tensor out of the
    tracer's sight (``StaleStatistics``), the pass runs again, RNG state rewound, reading every
    tensor back as it is seen.
    """

    def no_numerics(_: GradientLog | None) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # ``numerics`` wraps the whole pass instead

    with PassRunner(
        model, lambda: batch, loss_fn, fmt, first_then_anew(precision), no_numerics,
        backward=backward, half=half, fp32=fp32, count_all=count_all, retain_bytes=-1,
        outer=first_then_anew(numerics), observer=observer, grad_events=grad_events,
    ) as runner:  # fmt: skip
        return runner.run(grad_scale, gradients)


RETAIN_BYTES = 64 << 20
"""A forward whose traced outputs take at most this many bytes keeps its graph, so that a
backward at another loss scale reuses it instead of running the forward again; beyond it,
the forward runs again, and a scan's peak memory stays that of one plain backward (a retained
graph keeps every saved activation alive to the end of the backward)."""


class PassRunner:
    """Low-precision passes of one model at one or more loss scales, the forward shared.

    ``run(scale, gradients)`` returns the ``PassResult`` of a forward + loss + backward from
    ``loss * scale``. The first call runs the forward; later calls run only the backward, on
    the same graph, when the forward's traced outputs took at most ``retain_bytes``: the loss
    scale changes only the backward, and the backwards at several scales are then those of one
    training step, as a GradScaler's are (a model with dropout gets one mask for all of them;
    a forward per backward drew a new one each time). Otherwise, or once a backward on the kept
    graph failed, each call runs the whole pass. When a try ends in a signal (statistics gone
    stale, a gradient not measured), the pass runs again from the same RNG state, as
    ``pass_retry.RetryPolicy`` says. Use as a context manager: the model is restored on exit.

    ``batch()`` gives the batch of each forward (a copy, if the model may write into it);
    ``precision()`` makes the context of forward and loss (autocast and its policy);
    ``numerics(log)`` that of forward and backward (the FP16 emulation), logging gradients into
    ``log`` during a backward; ``outer()``, if given, one context around the forward and the
    backward of a whole pass (``run_pass``'s single-use ``numerics``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch: Callable[[], Batch],
        loss_fn: LossFn | None,
        fmt: FloatFormat,
        precision: Callable[[], contextlib.AbstractContextManager[Any]],
        numerics: Callable[[GradientLog | None], contextlib.AbstractContextManager[Any]],
        *,
        backward: bool,
        half: bool = False,
        fp32: bool = False,
        count_all: bool = False,
        retain_bytes: int | None = None,
        outer: Callable[[], contextlib.AbstractContextManager[Any] | None] | None = None,
        exact_zeros: bool = True,
        observer: OpObserver | None = None,
        grad_events: bool = True,
    ) -> None:
        self._observer = observer
        """Told each traced op's tensors and the gradients (``precision.compare``)."""
        self._grad_events = grad_events
        """Trace the backward of a pass run with ``events`` node by node; without, its forward
        is traced and its backward only takes the gradients (for the observer)."""
        self._model, self._batch, self._loss_fn, self._fmt = model, batch, loss_fn, fmt
        self._exact_zeros = exact_zeros
        """Count every FP16 result's zeros exactly (else large ones' are estimated, until a
        ``recount``)."""
        self._pass_rng: RngState | None = None
        """The RNG state the whole pass under way started from."""
        self._analysed_rng: RngState | None = None
        """The RNG state the forward of the last pass run with ``events`` started from (the pass
        the caller analyses and ``recount``s; the loss-scale window's passes run without)."""
        self._precision, self._numerics, self._outer = precision, numerics, outer
        self._backward, self._half, self._count_all = backward, half, count_all
        self._fp32 = fp32
        self._retain_bytes = RETAIN_BYTES if retain_bytes is None else retain_bytes
        self._forward: TracedForward | None = None
        self._policy = RetryPolicy()
        """How the next try runs: what earlier tries of this runner's passes learnt."""
        self.forwards = 0
        """Forwards run so far (for tests and benchmarks)."""

    def __enter__(self) -> PassRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the graph and restore the model (idempotent)."""
        forward, self._forward = self._forward, None
        if forward is not None:
            forward.close()

    def run(
        self, scale: float = 1.0, gradients: GradientLog | None = None, *, events: bool = True
    ) -> PassResult:
        """``events``: trace the backward node by node (``grad_events``); without, only the
        gradients are measured (``param_grads``, ``gradients``, ``gradients_finite``), which
        is what a backward run for the loss-scale window needs, at a fraction of the cost."""
        forward = self._forward
        if forward is not None and forward.reusable and self._policy.reuse_graph:
            try:
                result = forward.backward(
                    scale, gradients, retain=True, events=events and self._grad_events,
                    observe=events,
                )
                if events:
                    self._analysed_rng = forward.rng
                return result
            except RETRIED_ON_A_KEPT_GRAPH as exc:
                self._policy = self._policy.after_kept_graph(exc)  # the whole pass instead
                if gradients is not None:
                    gradients.reset()
        rng = self._pass_rng = rng_state()
        self._policy = self._policy.fresh()
        while True:
            self.close()
            try:
                with fewer_collections():
                    result = self._whole(scale, gradients, events)
                if events:
                    self._analysed_rng = rng
                return result
            except RETRIED as exc:
                self._policy = self._policy.after(exc)
            self.close()
            set_rng_state(rng)  # from the same RNG state
            if gradients is not None:
                gradients.reset(depth=self._policy.log_depth)

    @property
    def analysed_rng(self) -> RngState | None:
        """The RNG state the forward of the last pass run with ``events`` started from: another
        pass started from it draws the same dropout masks (the FP32 pass the precision check
        compares op by op)."""
        return self._analysed_rng

    def recount(self, result: PassResult) -> PassResult:
        """``result`` (this runner's last pass) with its forward events counted exactly: if
        zeros were estimated, the forward runs again, traced, from the RNG state the forward
        of the last pass run with ``events`` started from (the same dropout masks, so the same
        ops and values; a loss-scale window's pass may have run since, or the forward not been
        kept), and no backward runs (gradients have no zero counts). Later passes count
        exactly too."""
        self._exact_zeros = True
        if not result.estimated_zeros:
            return result
        self.close()
        if self._analysed_rng is not None:
            set_rng_state(self._analysed_rng)
        rng = rng_state()
        policy = self._policy.fresh()
        while True:
            outer = self._outer() if self._outer is not None else None
            forward = self._traced_forward(policy, backward=False)
            try:
                with fewer_collections(), outer or contextlib.nullcontext():
                    forward.run(self._precision())
                break
            except StaleStatistics as exc:
                policy = policy.after(exc)
                set_rng_state(rng)
            finally:
                forward.close()
        self.forwards += 1
        return replace(
            result,
            events=forward.events,
            first_origin_call=forward.first_origin_call,
            estimated_zeros=False,
        )

    def _traced_forward(
        self, policy: RetryPolicy, *, backward: bool, traced: bool = True
    ) -> TracedForward:
        return TracedForward(
            self._model, self._batch(), self._loss_fn, self._fmt, self._numerics,
            half=self._half, fp32=self._fp32, count_all=self._count_all, depth=policy.depth,
            backward=backward, every_histogram=policy.every_histogram,
            exact_zeros=self._exact_zeros, traced=traced, observer=self._observer,
        )  # fmt: skip

    def _whole(self, scale: float, gradients: GradientLog | None, events: bool) -> PassResult:
        outer = self._outer() if self._outer is not None else None
        with outer or contextlib.nullcontext():
            # A pass without events only measures gradients: its forward runs emulated, without
            # the tracer's per-op bookkeeping and statistics.
            forward = self._traced_forward(self._policy, backward=self._backward, traced=events)
            forward.rng = self._pass_rng
            self._forward = forward
            self.forwards += 1
            forward.run(self._precision())
            retain = self._policy.reuse_graph and (0 <= forward.output_bytes <= self._retain_bytes)
            result = forward.backward(
                scale, gradients, retain=retain, events=events and self._grad_events,
                observe=events,
            )
            if not retain:
                self.close()
            return result
