"""Where precision is lost: each op's measured error against FP32 (``precision.compare``), the
error its inputs already carried, and the ops where it jumps.

An op's *input error* is the largest error of the ops that produced its inputs (0 for a
parameter, the batch, a constant). Its error *jumps* when::

    error > jump * (input error + u)        u: the format's unit roundoff, 2**-8 BF16, 2**-11 FP16

that is, the op lost far more than one rounding of its result explains: the **origin of
precision loss** (NH602 for a subtraction, NH609 otherwise; NH601 when integers past the
format's exact range lie upstream).

Not an origin: an op whose FP32 result is below ``2**-126 / u`` (FP32's smallest normal over
the format's rounding: BF16 kernels on CPU flush subnormals, and flushing a value below 2**-126
changes it by up to 2**-126, more than one rounding of a result below the bound: underflow,
the range rules' NH202/NH502, not precision); a random draw in the format
(``torch.randn(..., dtype=bfloat16)`` draws other numbers than in FP32 from the same generator
state); a dropout (one rounding at most: a jump there is a mask that differs). An op that is not
compared (integer outputs: ``argmax``, ``argsort``) passes its inputs' error on, so what follows
a draw, or a sort of rounded values, is not an origin either.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import PrecisionVerdict
from nan_hunter.precision.compare import OpKey, PrecisionCheck
from nan_hunter.precision.formats import FP32, FloatFormat
from nan_hunter.trace.events import OpEvent

SUBTRACTIONS = frozenset({"sub", "rsub", "isub", "subtract"})
RANDOM_DRAWS = frozenset({
    "rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "normal",
    "uniform", "bernoulli", "multinomial", "exponential", "cauchy", "log_normal", "geometric",
    "poisson", "random",
})  # fmt: skip
"""Ops that draw random numbers: in BF16/FP16 other ones than in FP32 (CPU's vectorised normal
sampler runs for FP32 only), so their difference is not a loss of precision."""
DROPOUTS = frozenset({
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "native_dropout", "rrelu",
})  # fmt: skip
"""Ops with random masks: they zero values and scale the rest once, one rounding at most, so an
error jump there means the masks differ from the FP32 run's (a draw took other numbers from the
generator before, or the model reseeds it: Reformer's ``torch.seed()``), not lost precision."""
SELECTIONS = frozenset({"where", "masked_fill"})
"""Ops that fill masked places with a constant: a ``-1e5`` fill rounded to BF16 is no position."""


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
    ref_abs_max: float = math.inf
    """max |fp32| of its outputs."""
    draw: bool = False
    """A random draw or mask (``RANDOM_DRAWS``, ``DROPOUTS``): never an origin."""


@dataclass(frozen=True)
class PrecisionEvidence:
    """The precision check's per-op measurements, by the low-precision pass's op index."""

    ops: dict[int, OpPrecision]
    fmt: FloatFormat
    jump: float
    """The factor an op's error must exceed ``input error + u`` by to be an origin."""

    def measures_precision(self, op: OpPrecision) -> bool:
        """Its error is lost precision: finite, not a draw, not a result near underflow."""
        return (
            math.isfinite(op.error)
            and not op.draw
            and op.ref_abs_max >= FP32.smallest_normal / self.fmt.unit_roundoff
        )

    def jumped(self, op: OpPrecision) -> bool:
        return self.measures_precision(op) and op.error > self.jump * (
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
            cast = op_name(op.event) not in SELECTIONS and any(
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
    carried: dict[int, float] = {}  # each op's error, or its inputs' where it is not compared
    for e in low.events:
        input_error = max(
            (carried[p] for p in e.producers if p is not None and p in carried), default=0.0
        )
        measured = check.errors.get(e.key)
        if measured is None or not e.outputs_finite or not e.inputs_finite:
            if input_error > 0:
                carried[e.index] = input_error
            continue
        carried[e.index] = measured.error
        ops[e.index] = OpPrecision(
            e, measured.error, input_error, measured.integer_outputs, measured.integer_inputs,
            ref_events.get(e.key), measured.ref_abs_max, op_name(e) in RANDOM_DRAWS | DROPOUTS,
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
        (op for op in evidence.ops.values() if evidence.measures_precision(op)),
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
