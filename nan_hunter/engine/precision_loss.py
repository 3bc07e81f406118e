"""Where precision is lost: each op's measured error against FP32 (``precision.compare``), the
error its inputs already carried, and the ops where it jumps.

An op's *input error* is the largest error of the ops that produced its inputs (0 for a
parameter, the batch, a constant). Its error *jumps* when::

    error > jump * (input error + u)        u: the format's unit roundoff, 2**-8 BF16, 2**-11 FP16

that is, the op lost far more than one rounding of its result explains: the **origin of
precision loss** (NH602 for a subtraction, NH609 otherwise; NH601 when integers past the
format's exact range lie upstream).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import PrecisionVerdict
from nan_hunter.precision.compare import OpKey, PrecisionCheck
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace.events import OpEvent

SUBTRACTIONS = frozenset({"sub", "rsub", "isub", "subtract"})


def op_name(event: OpEvent) -> str:
    """``Tensor.__rsub__`` -> ``rsub``, ``torch.cumsum`` -> ``cumsum``."""
    return event.op.rsplit(".", 1)[-1].strip("_")


@dataclass(frozen=True)
class OpPrecision:
    """One compared op: its error against FP32 and its inputs' error."""

    event: OpEvent
    error: float
    input_error: float
    integer_outputs: bool = False
    integer_inputs: tuple[int, ...] = ()
    reference: OpEvent | None = None


@dataclass(frozen=True)
class PrecisionEvidence:
    """The precision check's per-op measurements, by the low-precision pass's op index."""

    ops: dict[int, OpPrecision]
    fmt: FloatFormat
    jump: float
    """The factor an op's error must exceed ``input error + u`` by to be an origin."""

    def jumped(self, op: OpPrecision) -> bool:
        return math.isfinite(op.error) and op.error > self.jump * (
            op.input_error + self.fmt.unit_roundoff
        )

    @property
    def origins(self) -> list[OpPrecision]:
        """The ops where the error jumps, in op order."""
        return [self.ops[i] for i in sorted(self.ops) if self.jumped(self.ops[i])]

    def integer_sites(self) -> list[OpPrecision]:
        """Ops that put integers beyond the format's exact range into low precision: they make
        them (``arange``, ``cumsum``, a cast) with a low-precision result that is not exact, or
        take them in FP32 and autocast casts them down (a rotary ``positions @ inv_freq``)."""
        found = []
        for i in sorted(self.ops):
            op = self.ops[i]
            low_out = any(s.dtype == self.fmt.name for s in op.event.outputs)
            if not low_out:
                continue
            made = op.integer_outputs and op.error > 0
            cast = any(
                p < len(op.event.inputs) and op.event.inputs[p].dtype == "float32"
                for p in op.integer_inputs
            )
            if made or cast:
                found.append(op)
        return found

    def downstream_of(self, events: tuple[OpEvent, ...], index: int, sources: set[int],
                      depth: int) -> int | None:
        """The nearest op of ``sources`` upstream of op ``index`` (within ``depth`` ops)."""
        queue = deque((p, 1) for p in events[index].producers if p is not None)
        seen: set[int] = set()
        while queue:
            p, level = queue.popleft()
            if p in seen or level > depth:
                continue
            seen.add(p)
            if p in sources:
                return p
            queue.extend((q, level + 1) for q in events[p].producers if q is not None)
        return None


def integer_checks(low: PassResult, fmt: FloatFormat) -> dict[OpKey, tuple[int, ...]]:
    """The ops whose FP32 values the reference pass checks for integers past ``fmt``'s exact
    range: those with a low-precision output beyond it, with the positions of their FP32
    inputs beyond it (what autocast may cast). Read from statistics, no tensor touched."""
    limit = fmt.exact_integers
    checks: dict[OpKey, tuple[int, ...]] = {}
    for e in low.events:
        low_outputs = [s for s in e.outputs if s.dtype == fmt.name]
        if not low_outputs:
            continue
        inputs = tuple(
            i for i, s in enumerate(e.inputs) if s.dtype == "float32" and s.exceeds(limit)
        )
        if inputs or any(s.exceeds(limit) for s in low_outputs):
            checks[e.key] = inputs
    return checks


def precision_evidence(
    low: PassResult, ref: PassResult | None, check: PrecisionCheck, fmt: FloatFormat, jump: float
) -> PrecisionEvidence:
    ref_events = {e.key: e for e in ref.events} if ref is not None else {}
    ops: dict[int, OpPrecision] = {}
    for e in low.events:
        measured = check.errors.get(e.key)
        if measured is None or not e.outputs_finite or not e.inputs_finite:
            continue
        input_error = max(
            (ops[p].error for p in e.producers if p is not None and p in ops), default=0.0
        )
        ops[e.index] = OpPrecision(
            e, measured.error, input_error, measured.integer_outputs, measured.integer_inputs,
            ref_events.get(e.key),
        )  # fmt: skip
    return PrecisionEvidence(ops, fmt, jump)


def precision_verdict(
    low: PassResult, ref: PassResult | None, check: PrecisionCheck, evidence: PrecisionEvidence
) -> PrecisionVerdict:
    """The loss's relative error, the gradients' cosine and the largest op error."""
    loss_error = None
    if low.loss is not None and ref is not None and ref.loss is not None:
        a, b = low.loss.max, ref.loss.max
        if a is not None and b is not None and low.loss.finite and ref.loss.finite:
            loss_error = abs(a - b) / abs(b) if b != 0 else (0.0 if a == b else math.inf)
    worst = max(
        (op for op in evidence.ops.values() if math.isfinite(op.error)),
        key=lambda op: op.error, default=None,
    )  # fmt: skip
    where = ""
    if worst is not None and worst.event.location is not None:
        loc = worst.event.location
        where = f"{worst.event.op} ({loc.file.rsplit('/', 1)[-1]}:{loc.line})"
    return PrecisionVerdict(
        loss_error=loss_error,
        grad_cosine=check.grad_cosine,
        compared=len(evidence.ops),
        largest_error=worst.error if worst is not None else None,
        largest_at=where,
        complete=check.kept_all,
    )
