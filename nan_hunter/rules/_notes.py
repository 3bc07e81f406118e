"""Notes an origin finding carries besides its rule's message."""

from __future__ import annotations

from pathlib import PurePath

from nan_hunter.engine.candidate import Candidate
from nan_hunter.findings import Kind
from nan_hunter.precision.formats import BF16, FP16
from nan_hunter.trace.stats import format_number

CONTAINED = (
    "contained: these non-finite values only reach integer or boolean results "
    "(indices, masks); no floating value downstream depends on them"
)


def absorbed(c: Candidate) -> str:
    """Why an origin whose values the model absorbs is a warning: what absorbed them."""
    sites = []
    for event in c.absorbed_by[:3]:
        where = event.call_site or event.location
        line = f" at {PurePath(where.file).name}:{where.line}" if where is not None else ""
        sites.append(f"{event.op.rsplit('.', 1)[-1]}{line}")
    more = len(c.absorbed_by) - len(sites)
    return (
        f"absorbed by {', '.join(sites)}{f' and {more} more ops' if more else ''}: the "
        "non-finite values reach no module output, and the loss and gradients stay finite "
        "(a warning; --fail-on warning fails on it)"
    )


def bf16_alternative(c: Candidate, kind: Kind) -> tuple[str, ...]:
    """"BF16 would avoid this" when an FP16 culprit's FP32 values fit BF16's range."""
    if c.fmt is not FP16 or c.ref_finite is not True:
        return ()
    largest = max(
        [c.ref_abs_max or 0.0] + [c.event.inputs[i].abs_max or 0.0 for i in c.cast_inputs]
    )
    if kind is Kind.OVERFLOW and 0.0 < largest < BF16.max:
        reach = format_number(largest)
        return (
            f"BF16 would avoid this: its range reaches {format_number(BF16.max)} and this op's "
            f"FP32 values reach {reach}; use torch.autocast(..., dtype=torch.bfloat16)",
        )
    if kind is Kind.UNDERFLOW:
        return (
            "BF16 would avoid this: its smallest normal is "
            f"{format_number(BF16.smallest_normal)}, so small values and eps constants survive; "
            "use torch.autocast(..., dtype=torch.bfloat16)",
        )
    return ()
