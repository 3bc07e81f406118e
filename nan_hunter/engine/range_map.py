"""Build the range map (``nan_hunter.core.range_map``) from the statistics a pass already took.

No tensor is touched: every number comes from the ``TensorStats`` of the events (largest finite
|x|, values below the smallest normal, NaN/inf counts), so the map costs one walk over the
events and no host read.

What counts, as what can overflow:
- forward: each op's floating outputs in the low-precision format, and its FP32 outputs where
  autocast is on and outside the loss (a later op may cast them down, NH501's case); FP32
  values in ``autocast(enabled=False)`` regions and in the loss stay FP32;
- backward: the gradients reaching each op in the low-precision format, at the loss scale of
  the pass (the FP32 seed of the loss, which equals the scale, is not at risk); an op whose
  backward made NaN/inf from finite gradients has no headroom left;
- an op whose inputs already held NaN/inf only carries them: its values count in its module's
  ``nonfinite``, not in the ``closest`` lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nan_hunter.core.range_map import CLOSEST, Extent, ModuleRange, OpRange, RangeMap
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace.events import GradEvent, OpEvent
from nan_hunter.trace.summary import TensorStats

LOSS_MODULE = "(loss)"


def build_range_map(
    events: Sequence[OpEvent],
    grad_events: Iterable[GradEvent],
    fmt: FloatFormat,
    loss_scale: float,
) -> RangeMap:
    """The range map of one pass: per module in execution order, and the ops nearest each
    limit."""
    forward: dict[int, Extent] = {}
    for event in events:
        kept = [s for s in event.outputs if at_risk_output(event, s, fmt)]
        if kept:
            forward[event.index] = _extent(kept, origin=event.inputs_finite
                                           and not event.outputs_finite)
    backward: dict[int, Extent] = {}
    for grad in grad_events:
        if not 0 <= grad.forward_index < len(events):
            continue
        origin = _backward_origin(grad, events[grad.forward_index])
        kept = [s for s in grad.incoming if s.dtype == fmt.name or origin]
        if kept:
            extent = _extent(kept, origin=origin)
            previous = backward.get(grad.forward_index)
            backward[grad.forward_index] = extent if previous is None else previous.merged(extent)
    modules = _modules(events, forward, backward)
    ops = [
        *(_op(events[i], "forward", e) for i, e in forward.items() if events[i].inputs_finite),
        *(_op(events[i], "backward", e) for i, e in backward.items() if e.nonfinite == 0),
    ]
    ranked = [o for o in ops if o.extent.headroom(fmt.max) is not None]
    top = sorted(ranked, key=lambda o: (o.extent.headroom(fmt.max), o.phase, o.op_index))
    tiny = [o for o in ops if o.extent.tiny]
    bottom = sorted(tiny, key=lambda o: (-o.extent.tiny_share, o.phase, o.op_index))
    return RangeMap(
        format=fmt.name,
        limit=fmt.max,
        smallest_normal=fmt.smallest_normal,
        loss_scale=loss_scale,
        modules=modules,
        top=tuple(top[:CLOSEST]),
        bottom=tuple(bottom[:CLOSEST]),
    )


def _backward_origin(grad: GradEvent, forward: OpEvent) -> bool:
    """The node made NaN/inf from finite gradients, for an op whose forward was finite (after
    a broken forward, a backward only passes the damage on: ``analysis.backward_origins``)."""
    return grad.is_origin and forward.inputs_finite and forward.outputs_finite


def at_risk_output(event: OpEvent, s: TensorStats, fmt: FloatFormat) -> bool:
    """Whether output ``s`` of ``event`` can overflow ``fmt``: it is in ``fmt``, or it is an
    FP32 value autocast may cast down later (autocast on, outside the loss). Memory no op
    wrote (``torch.empty``'s result) holds no values to measure."""
    if s.unwritten:
        return False
    if s.dtype == fmt.name:
        return True
    return s.dtype == "float32" and event.autocast and not event.in_loss


def _extent(stats: Sequence[TensorStats], *, origin: bool) -> Extent:
    highs = [s.abs_max for s in stats if s.abs_max is not None]
    return Extent(
        abs_max=max(highs) if highs else None,
        values=sum(s.numel - s.nonfinite for s in stats),
        tiny=sum(s.tiny or 0 for s in stats),
        nonfinite=sum(s.nonfinite for s in stats),
        overflowed=origin,
    )


def module_of(event: OpEvent) -> str:
    """The map's row of an op: its innermost module, or ``(loss)`` for the loss function."""
    return LOSS_MODULE if event.in_loss else event.module


def _op(event: OpEvent, phase: str, extent: Extent) -> OpRange:
    return OpRange(
        op=event.op,
        module=module_of(event),
        phase=phase,
        location=event.call_site or event.location,
        extent=extent,
        op_index=event.index,
    )


def _modules(
    events: Sequence[OpEvent], forward: dict[int, Extent], backward: dict[int, Extent]
) -> tuple[ModuleRange, ...]:
    rows: dict[str, ModuleRange] = {}
    for event in events:
        fwd, bwd = forward.get(event.index), backward.get(event.index)
        if fwd is None and bwd is None:
            continue
        name = module_of(event)
        row = rows.get(name)
        if row is None:
            row = ModuleRange(name, Extent(None), None, 0, event.index)
        rows[name] = ModuleRange(
            module=name,
            forward=row.forward if fwd is None else row.forward.merged(fwd),
            backward=bwd if row.backward is None else (
                row.backward if bwd is None else row.backward.merged(bwd)
            ),
            ops=row.ops + 1,
            first_op=row.first_op,
        )
    return tuple(rows.values())
