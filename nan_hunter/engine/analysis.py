"""From traced passes to finding candidates: origins, their FP32 verdicts and upstream causes.

An op is an *origin* when its inputs are finite and its output is not; later ops that only carry
its NaN/inf are *propagation*. So is an op that reads a non-finite *constant* (a Python float
such as ``float('nan')``, a tensor no traced op made, a buffer) with finite traced inputs and
gives a non-finite result that is not absorbed on the way out (a ``-inf`` mask a softmax takes
in is not; one that reaches the loss is). Each origin is matched, by ``OpEvent.key``, with the
same op in the FP32 reference pass: finite there means a precision problem, non-finite means a
real bug, unless its non-finite values are absorbed on the way out as a mask's are (a sum of two
``finfo(float32).min`` that a softmax takes in: ``benign_in_fp32``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

from nan_hunter.engine.candidate import Candidate, RoundedConstant, Upstream
from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import Phase, SourceLocation
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import ScaleWindow
from nan_hunter.precision.replay import replay_in_fp32
from nan_hunter.project.paths import is_installed
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.events import CapturedCall, GradEvent, OpEvent
from nan_hunter.trace.stats import TensorStats


@dataclass(frozen=True)
class Analysis:
    failures: tuple[Candidate, ...]
    """Ops that fail the way CUDA fails (banned under autocast, no FP16 kernel)."""
    forward: tuple[Candidate, ...]
    backward: tuple[Candidate, ...]
    propagated: int
    reads_low_zeros: bool = False
    """Whether a verdict read the low-precision pass's zero counts: an upstream search for
    values flushed to 0, or an origin the FP32 pass has no reference for (its own inputs'
    counts stand in)."""


def forward_origins(result: PassResult) -> list[OpEvent]:
    """The origins of ``result``'s forward, in op order: ops with finite inputs and non-finite
    outputs, and ops a non-finite constant operand makes so (``constant_origins``)."""
    found = [
        e for e in result.events if e.failure is None and e.inputs_finite and not e.outputs_finite
    ]
    constant = constant_origins(result.events)
    return sorted([*found, *constant], key=lambda e: e.index) if constant else found


def nonfinite_constants(event: OpEvent) -> tuple[str, ...]:
    """The operands of ``event`` that are non-finite constants, as the user would write them:
    Python floats (``float('nan')``) and tensors no traced op made (a buffer, a tensor built
    outside the forward). Empty when a tensor a traced op made is non-finite too: the op then
    carries damage from upstream, whatever its constants."""
    found: list[str] = []
    for stats, producer in zip(event.inputs, event.producers, strict=False):
        if stats.finite:
            continue
        if producer is not None:
            return ()
        found.append(_held(stats))
    found += [f"float({str(v)!r})" for v in event.scalars if not math.isfinite(v)]
    return tuple(dict.fromkeys(found))


def _held(stats: TensorStats) -> str:
    values = [n for n, count in (("NaN", stats.nan), ("inf", stats.posinf), ("-inf", stats.neginf))
              if count]
    shape = "a 0-d tensor" if not stats.shape else "a tensor"
    return f"{shape} holding {' and '.join(values)} that no traced op made (a buffer, a constant)"


def constant_origins(events: tuple[OpEvent, ...]) -> list[OpEvent]:
    """Ops whose non-finite output comes from a non-finite constant operand
    (``nonfinite_constants``) and leaves the traced code non-finite (``escapes``): ``h *
    float('nan')``. A ``-inf`` a later op absorbs (a mask a softmax takes in) is no origin."""
    suspects = [
        e for e in events
        if e.failure is None and not e.inputs_finite and not e.outputs_finite
        and nonfinite_constants(e)
    ]
    if not suspects:
        return []
    consumers = consumer_map(events)
    return [e for e in suspects if escapes(events, consumers, e.index)]


def reached(
    events: tuple[OpEvent, ...], consumers: dict[int, list[int]], origin: int
) -> Iterator[tuple[int, str]]:
    """The ops ``origin``'s non-finite values reach, each once, depth first, with what happens
    to them there: ``integers`` (no floating result: they became integers or booleans),
    ``finite`` (its floating results are finite: absorbed here, a softmax over a ``-inf``
    mask), ``leaves`` (non-finite, and no traced op takes it: it leaves the traced code),
    ``into_loss`` (non-finite, the model's output a traced loss takes in) or ``on`` (non-finite,
    carried on). The walk goes on past ``into_loss`` and ``on``. One walk for ``escapes``,
    ``contained`` and ``absorbers``."""
    stack = [origin]
    seen: set[int] = set()
    while stack:
        index = stack.pop()
        if index in seen:
            continue
        seen.add(index)
        event = events[index]
        floating = [s for s in event.outputs if s.is_floating]
        if not floating:
            yield index, "integers"
            continue
        if all(s.finite for s in floating):
            yield index, "finite"
            continue
        nxt = consumers.get(index, [])
        if not nxt:
            yield index, "leaves"
            continue
        into_loss = not event.in_loss and any(events[i].in_loss for i in nxt)
        yield index, "into_loss" if into_loss else "on"
        stack.extend(nxt)


def escapes(events: tuple[OpEvent, ...], consumers: dict[int, list[int]], origin: int) -> bool:
    """True when a non-finite floating value that ``origin``'s output reaches leaves the traced
    code or is the model's output a traced loss takes in: no op on the way turned it finite or
    into integers."""
    return any(kind in ("leaves", "into_loss") for _, kind in reached(events, consumers, origin))


def benign_in_fp32(
    events: tuple[OpEvent, ...],
    consumers: dict[int, list[int]],
    origin: OpEvent,
    reference: OpEvent | None,
) -> bool:
    """An origin that is no bug: non-finite in FP32 too (a mask by design: GPT-Neo adds
    ``torch.finfo(float32).min`` to ``torch.finfo(float32).min``, which is ``-inf``), and its
    non-finite values are absorbed on the way by a floating op (a softmax takes the ``-inf``
    in): none reaches the loss or leaves the traced code (``escapes``), like a constant's
    ``-inf`` mask (``constant_origins``). Values only integers take in stay ``contained``.
    In low precision the same sum is finite (``finfo(float16).min`` plus the FP32 minimum),
    so it appears once a fix computes the scores in FP32, and must not refute that fix as a
    new real bug."""
    if reference is None or reference.outputs_finite or not origin.inputs_finite:
        return False
    if contained(events, consumers, origin.index):
        return False  # only integers take them in (T5's log(0) buckets): info, as before
    return not escapes(events, consumers, origin.index)


def failures(result: PassResult) -> list[OpEvent]:
    return [e for e in result.events if e.failure is not None]


def backward_origins(result: PassResult) -> list[GradEvent]:
    """Backward nodes where gradients first go non-finite, for ops whose forward was finite (an
    op that saw NaN/inf in forward only passes the damage on).

    A node that receives finite gradients and produces non-finite ones is an origin. So is the
    first node that *receives* non-finite gradients before any traced node produced one: the
    damage then comes from untraced code between the loss and the model (the loss scale, the
    default loss), and this node is where it enters the model.
    """
    found = []
    damaged = False
    events = result.events
    for g in result.grad_events:
        if g.incoming_finite and g.produced_finite:
            continue  # neither an origin nor damage
        forward = events[g.forward_index]
        if not damaged and forward.inputs_finite and forward.outputs_finite:
            found.append(g)  # an origin, or the first node damage reaches from outside
        damaged = True
    return found


def cast_inputs(event: OpEvent, fmt: FloatFormat) -> tuple[int, ...]:
    """FP32 inputs beyond ``fmt``'s range of an op with output in ``fmt``: autocast cast them."""
    if not any(s.dtype == fmt.name for s in event.outputs):
        return ()
    return tuple(
        i for i, s in enumerate(event.inputs) if s.dtype == "float32" and s.exceeds(fmt.max)
    )


def rerun_in_fp32(call: CapturedCall) -> bool | None:
    """Rerun a captured op on its own inputs upcast to FP32; True when the output is finite."""
    try:
        with torch.no_grad():
            out = replay_in_fp32(call.func, call.args, call.kwargs, float64_too=True)
    except Exception:
        return None  # the op does not accept FP32 in this form: no verdict from the rerun
    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return all(bool(real.isfinite(t).all()) for t in tensors if t.is_floating_point())


def _producers(events: tuple[OpEvent, ...], start: OpEvent, depth: int) -> Iterator[OpEvent]:
    """Ops upstream of ``start`` through its inputs, nearest first (breadth-first)."""
    seen: set[int] = set()
    queue = deque((p, 1) for p in start.producers if p is not None)
    while queue:
        index, level = queue.popleft()
        if index in seen or level > depth:
            continue
        seen.add(index)
        event = events[index]
        yield event
        queue.extend((p, level + 1) for p in event.producers if p is not None)


# Ops whose Python-scalar operand is rounded into the low-precision result (``m + 1e-8``); a norm's
# ``eps=`` is applied in FP32 inside the kernel and never lost.
_SCALAR_ARITHMETIC = frozenset(
    {"add", "sub", "div", "truediv", "clamp", "clamp_min", "clamp_max", "maximum", "minimum",
     "where", "addcdiv", "addcmul", "masked_fill", "fill"}
)


def _is_elementwise_arithmetic(op: str) -> bool:
    name = op.rsplit(".", 1)[-1].strip("_")
    if op.rsplit(".", 1)[-1].startswith("__") and name[:1] in ("r", "i") and (
        name[1:] in _SCALAR_ARITHMETIC
    ):
        name = name[1:]  # __radd__, __iadd__
    return name in _SCALAR_ARITHMETIC


def consumer_map(events: tuple[OpEvent, ...]) -> dict[int, list[int]]:
    consumers: dict[int, list[int]] = {}
    for event in events:
        for p in dict.fromkeys(event.producers):
            if p is not None:
                consumers.setdefault(p, []).append(event.index)
    return consumers


def contained(events: tuple[OpEvent, ...], consumers: dict[int, list[int]], origin: int) -> bool:
    """True when the origin's non-finite values only ever reach integer or boolean results
    (T5's ``log(0)`` that becomes a bucket index): no floating value downstream depends on
    them, so training is unaffected. A chain that ends in an unconsumed floating value (a
    model output, the loss) is not contained."""
    return not any(kind in ("finite", "leaves") for _, kind in reached(events, consumers, origin))


def absorbers(
    events: tuple[OpEvent, ...],
    consumers: dict[int, list[int]],
    origin: int,
    escaped: frozenset[int],
) -> tuple[OpEvent, ...]:
    """The ops that turn ``origin``'s non-finite values finite again (a softmax over a ``-inf``
    mask), when every path from it ends at one: no non-finite floating value leaves a module,
    reaches the loss or the end of the traced code (``escapes``). Empty otherwise, and when the
    values only ever reach integers (``contained``)."""
    found: list[OpEvent] = []
    for index, kind in reached(events, consumers, origin):
        if kind == "finite":
            found.append(events[index])  # absorbed here
        elif kind in ("leaves", "into_loss") or (kind == "on" and index in escaped):
            return ()
    return tuple(sorted(found, key=lambda e: e.index))


def absorbed_as_in_fp32(
    absorbing: tuple[OpEvent, ...], reference: dict[tuple[str, str, int, int], OpEvent]
) -> bool:
    """Whether each absorbing op computed what it computes in the FP32 reference run (its
    output's extremes within 5%): a softmax over a ``-inf`` mask gives the probabilities FP32
    gives. ``rsqrt(inf) = 0`` absorbs an overflow too, into zeros where FP32 has 1/600: that
    is the damage (an RMS norm's output silently 0), not its absorption."""
    if not absorbing:
        return False
    for event in absorbing:
        ref = reference.get(event.key)
        if ref is None or len(ref.outputs) != len(event.outputs):
            return False
        for low, fp32 in zip(event.outputs, ref.outputs, strict=True):
            if not low.is_floating:
                continue
            for a, b in ((low.min, fp32.min), (low.max, fp32.max)):
                if a is None or b is None or abs(a - b) > 0.05 * max(abs(a), abs(b)) + 1e-6:
                    return False
    return True


def _beyond_range_constant(event: OpEvent, fmt: FloatFormat) -> bool:
    """Whether ``event`` reads a Python number beyond ``fmt``'s range (a mask's ``1e30``): an
    inf made on purpose, as a sentinel some later op absorbs. An overflow of computed values
    (``x * x``, a matmul) is no sentinel: absorbed on this batch, it stays an error."""
    return any(abs(v) > fmt.max for v in event.scalars)


def gradients_stay_finite(result: PassResult) -> bool:
    """Whether a backward ran, from a finite loss, and every gradient it traced stayed finite:
    an inf absorbed in the forward that makes a NaN in the backward (``0 * inf`` in a
    product's gradient) is no harmless one."""
    return (
        result.backward_ran
        and result.loss is not None
        and result.loss.finite
        and bool(result.grad_events)
        and all(g.incoming_finite and g.produced_finite for g in result.grad_events)
    )


def find_upstream(
    events: tuple[OpEvent, ...],
    reference: dict[tuple[str, str, int, int], OpEvent],
    origin: OpEvent,
    fmt: FloatFormat,
    depth: int,
) -> Upstream | None:
    """The nearest upstream op whose low-precision result lost what FP32 kept: an eps that
    rounds to 0, or values flushed to 0."""
    for event in _producers(events, origin, depth):
        in_low = any(s.dtype == fmt.name for s in event.outputs)
        if in_low and _is_elementwise_arithmetic(event.op) and any(
            fmt.rounds_to_zero(v) for v in event.scalars
        ):
            return Upstream(event, "eps")
        ref = reference.get(event.key)
        if in_low and ref is not None:
            low_zeros = sum(s.zeros or 0 for s in event.outputs)
            ref_zeros = sum(s.zeros or 0 for s in ref.outputs)
            if low_zeros > ref_zeros and _is_subtraction(event.op):
                constants = tuple(rounded_constants(events, event, fmt))
                return Upstream(event, "cancel", ref, constants)
            if low_zeros > ref_zeros:
                return Upstream(event, "flush", ref, lost_eps=lost_eps(
                    events, reference, event, fmt, depth))
    return None


_ADDS = frozenset({"add", "radd", "iadd"})


def lost_eps(
    events: tuple[OpEvent, ...],
    reference: dict[tuple[str, str, int, int], OpEvent],
    start: OpEvent,
    fmt: FloatFormat,
    depth: int,
) -> RoundedConstant | None:
    """The nearest add at or upstream of ``start`` (the op whose values flushed), with its
    result in ``fmt``, whose constant is nonzero and below ``fmt``'s smallest normal: a Python
    number the trace saw, or a 0-dim tensor (an eps buffer) as the FP32 reference run
    saw it (``.half()`` has already made it 0 in the low-precision pass)."""
    for event in (start, *_producers(events, start, depth)):
        if event.op.rsplit(".", 1)[-1].strip("_") not in _ADDS:
            continue
        if not any(s.dtype == fmt.name for s in event.outputs):
            continue
        ref = reference.get(event.key)
        held = [*event.scalars, *(
            s.abs_max for s in (ref.inputs if ref is not None else ())
            if s.shape == () and s.is_floating and s.abs_max is not None
        )]
        for value in held:
            if value != 0 and abs(value) < fmt.smallest_normal:
                return RoundedConstant(value, fmt.round(value), event)
    return None


def _is_subtraction(op: str) -> bool:
    return op.rsplit(".", 1)[-1].strip("_") in ("sub", "rsub", "isub", "subtract")


def rounded_constants(
    events: tuple[OpEvent, ...], start: OpEvent, fmt: FloatFormat, depth: int = 4
) -> Iterator[RoundedConstant]:
    """The Python numbers ``start`` and the ops producing its inputs read (nearest first) whose
    value in ``fmt`` is 0 or ±1 while the number is not: ``x * 0.99999`` is ``x`` in FP16,
    ``1 - 1e-5`` is 1. Only ops whose result is in ``fmt``."""
    for event in (start, *_producers(events, start, depth)):
        if not any(s.dtype == fmt.name for s in event.outputs):
            continue
        for value in event.scalars:
            rounded = fmt.round(value)
            if rounded != value and rounded in (0.0, 1.0, -1.0):
                yield RoundedConstant(value, rounded, event)


def out_of_range_consumers(
    events: tuple[OpEvent, ...] | list[OpEvent],
    consumers: dict[int, list[int]],
    ref_events: dict[tuple[str, str, int, int], OpEvent],
    origin: OpEvent,
    fmt: FloatFormat,
    depth: int = 8,
) -> tuple[OpEvent, ...]:
    """The ops after ``origin``, in the user's project (an installed library's op counts at its
    call site there), that still carry values beyond ``fmt``'s range in the FP32 reference, and
    the first op on each path that brings them back (a softmax, a normalisation): where an FP32
    region must end before values go back to low precision."""
    home = _user_site(origin)
    if home is None:
        return ()

    def beyond(event: OpEvent) -> bool:
        ref = ref_events.get(event.key)
        return ref is not None and any(o.exceeds(fmt.max) for o in ref.outputs)

    if not beyond(origin):
        return ()
    found: dict[int, OpEvent] = {}
    frontier = list(consumers.get(origin.index, []))
    for _ in range(depth):
        following: list[int] = []
        for index in frontier:
            event = events[index]
            site = _user_site(event)
            if index in found or site is None or is_installed(site.file):
                continue
            found[index] = event
            if beyond(event):
                following.extend(consumers.get(index, []))
        frontier = following
    return tuple(found[i] for i in sorted(found))


def _in_range(ref: OpEvent | None, fmt: FloatFormat) -> bool:
    """The op's FP32 reference values are finite and within ``fmt``'s range."""
    return ref is not None and ref.outputs_finite and not any(
        o.exceeds(fmt.max) for o in ref.outputs
    )


def _user_site(event: OpEvent) -> SourceLocation | None:
    """Where ``event`` is in the user's code: its own line, or for an op that ran in an
    installed library (``nn.Linear``'s ``F.linear``), the call site in the user's project."""
    return event.call_site if event.call_site is not None else event.location


def low_precision_chain(
    events: tuple[OpEvent, ...] | list[OpEvent], origin: OpEvent, fmt: FloatFormat, depth: int
) -> tuple[OpEvent, ...]:
    """The ops upstream of ``origin``, in its file, whose results were rounded to ``fmt``: the
    statements a region must take in when FP32 fails on the origin's own rounded inputs (a
    ``clamp(max=1 - 1e-6)`` that is a no-op in FP16, a sigmoid already rounded to 1)."""
    if origin.location is None:
        return ()
    found: dict[int, OpEvent] = {}
    frontier = [p for p in origin.producers if p is not None]
    for _ in range(max(depth, 1)):
        following: list[int] = []
        for index in frontier:
            if index in found:
                continue
            event = events[index]
            if event.location is None or event.location.file != origin.location.file:
                continue
            if not any(s.dtype == fmt.name for s in event.outputs):
                continue
            found[index] = event
            following.extend(p for p in event.producers if p is not None)
        frontier = following
    return tuple(found[i] for i in sorted(found))


def _producer_lines(events: tuple[OpEvent, ...], origin: OpEvent, inputs: tuple[int, ...]) -> (
    tuple[int, ...]
):
    if origin.location is None:
        return ()
    lines = []
    for i in inputs:
        index = origin.producers[i] if i < len(origin.producers) else None
        if index is None:
            continue
        where = events[index].location
        if where is not None and where.file == origin.location.file:
            lines.append(where.line)
    return tuple(sorted(set(lines)))


def analyse(
    low: PassResult,
    ref: PassResult | None,
    fmt: FloatFormat,
    *,
    upstream_depth: int,
    window: ScaleWindow | None = None,
    grad_scale: float = 1.0,
) -> Analysis:
    ref_events = {e.key: e for e in ref.events} if ref else {}
    ref_grads: dict[tuple[str, str, int, int], GradEvent] = {}
    if ref is not None:
        for g in ref.grad_events:
            ref_grads.setdefault(ref.events[g.forward_index].key, g)

    consumers = consumer_map(low.events)
    forward: list[Candidate] = []
    reads_low_zeros = False
    # The tracer keeps the arguments of the first op with finite inputs (constants included)
    # and a non-finite output: the rerun is that op's, whichever origin comes first.
    captured = next(
        (e.index for e in low.events if e.inputs_finite and not e.outputs_finite), None
    )
    origins = forward_origins(low)
    constant = {e.index for e in origins if not e.inputs_finite}
    harmless = gradients_stay_finite(low)
    for event in origins:
        absorbing = (
            absorbers(low.events, consumers, event.index, low.escaped)
            if harmless and event.index not in constant and _beyond_range_constant(event, fmt)
            else ()
        )
        casts = cast_inputs(event, fmt)
        reference = ref_events.get(event.key)
        if event.index in constant and reference is not None and reference.outputs_finite:
            continue  # the constant is finite in FP32: the cast to FP16 made it inf (NH005)
        if benign_in_fp32(low.events, consumers, event, reference):
            continue
        own = (
            rerun_in_fp32(low.first_origin_call)
            if event.index == captured and low.first_origin_call else None
        )
        upstream = None
        if reference is None:
            reads_low_zeros = True
        elif reference.outputs_finite and not casts and own is False:
            # FP32 fails on the op's own low-precision inputs: the damage was done upstream
            upstream = find_upstream(low.events, ref_events, event, fmt, upstream_depth)
            reads_low_zeros = True
        after = out_of_range_consumers(low.events, consumers, ref_events, event, fmt)
        forward.append(
            Candidate(
                phase=Phase.FORWARD,
                event=event,
                fmt=fmt,
                reference=reference,
                cast_inputs=casts,
                upstream=upstream,
                own_inputs_finite=own,
                producer_lines=_producer_lines(low.events, event, casts),
                input_producers=tuple(
                    low.events[p] for p in dict.fromkeys(event.producers) if p is not None
                ),
                out_of_range_consumers=after,
                consumers=tuple(low.events[i] for i in consumers.get(event.index, [])),
                back_in_range=tuple(
                    e.index for e in after if _in_range(ref_events.get(e.key), fmt)
                ),
                rounded_chain=(
                    low_precision_chain(low.events, event, fmt, upstream_depth)
                    if own is False else ()
                ),
                contained=contained(low.events, consumers, event.index),
                constants=nonfinite_constants(event) if event.index in constant else (),
                absorbed_by=absorbing if absorbed_as_in_fp32(absorbing, ref_events) else (),
            )
        )

    backward: list[Candidate] = []
    for g in backward_origins(low):
        event = low.events[g.forward_index]
        ref_grad = ref_grads.get(event.key)
        whole = None
        if ref_grad is None and ref is not None and ref.backward_ran:
            # The op has no backward of its own in FP32 (``.float()`` of an FP32 tensor): judge
            # by the whole FP32 backward instead.
            whole = all(s.finite for r in ref.grad_events for s in r.produced)
        backward.append(
            Candidate(
                phase=Phase.BACKWARD,
                event=event,
                fmt=fmt,
                grad=g,
                ref_grad=ref_grad,
                ref_backward_finite=whole,
                scale_window=window,
                grad_scale=grad_scale,
            )
        )

    failed = tuple(
        Candidate(phase=Phase.FORWARD, event=e, fmt=fmt, reference=ref_events.get(e.key))
        for e in failures(low)
    )
    propagated = sum(
        1 for e in low.events
        if not e.inputs_finite and not e.outputs_finite and e.index not in constant
    )
    reads_low_zeros = reads_low_zeros or any(c.reference is None for c in failed)
    return Analysis(failed, tuple(forward), tuple(backward), propagated, reads_low_zeros)
