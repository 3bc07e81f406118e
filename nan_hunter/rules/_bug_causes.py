"""The cause of a real bug (NH301: non-finite in FP32 too), decided from the traced evidence of
the op's forward in the FP32 reference: its name, its inputs' and outputs' statistics, the
Python numbers it read. Each cause comes with the guard to write.

    >>> h[:, :1].std(-1)       # one value per row: N - 1 = 0
    an unbiased std of 1 value (N - 1 = 0 divides by 0)
    -> x.std(dim, correction=0) (unbiased=False), or only where the dimension holds > 1 value

A cause the evidence does not settle is left to the op's table in ``nh301_fp32_too``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nan_hunter.findings import Phase
from nan_hunter.precision.formats import FP32
from nan_hunter.rules.registry import Candidate
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import TensorStats, format_number


@dataclass(frozen=True)
class Diagnosis:
    """What made an op non-finite in FP32, and the guard that prevents it."""

    cause: str
    """Completes "likely ...": names the evidence (``an unbiased std over 1 value ...``)."""
    advice: str
    """The guard to write, with code."""


_FP32_MAX = format_number(FP32.max)

_SPREAD = frozenset({"std", "var", "std_mean", "var_mean"})
_AVERAGES = _SPREAD | {"mean", "nanmean"}
_DIVISIONS = frozenset({"truediv", "div", "rtruediv"})
_COUNTS = frozenset({"sum", "count_nonzero"})
_LOGS = frozenset({"log", "log2", "log10"})
_POWERS = frozenset({"pow", "rpow", "square", "float_power"})
_NORMALISE = (
    "Bring the operands into range: normalise them (a layer norm, a smaller init) before the "
    "product"
)
_OVERFLOWS = {
    "exp": "Keep the exponent below 88.7 (exp overflows FP32 beyond it): subtract the "
    "maximum first (torch.softmax, torch.logsumexp), or torch.exp(x.clamp_max(80))",
    "exp2": "Keep the exponent below 128: torch.exp2(x.clamp_max(120))",
    "expm1": "Keep the exponent below 88.7: torch.expm1(x.clamp_max(80))",
    "cosh": "Keep the input below 89 in magnitude: torch.cosh(x.clamp(-80, 80))",
    "sinh": "Keep the input below 89 in magnitude: torch.sinh(x.clamp(-80, 80))",
    "mul": "Bring the operands into range before the product: normalise them, or work in "
    "log space (log a + log b)",
    "matmul": _NORMALISE,
    "mm": _NORMALISE,
    "bmm": _NORMALISE,
    "prod": "Work in log space: torch.log(x.abs()).sum() instead of the product",
    "cumprod": "Work in log space: torch.cumsum(torch.log(x.abs()), dim)",
}
"""Ops whose inf with finite inputs is an FP32 overflow, with the guard for each."""


def diagnose(c: Candidate) -> Diagnosis | None:
    """The cause of a forward op's non-finite FP32 result when its evidence settles it."""
    ref = c.reference
    if c.phase is not Phase.FORWARD or ref is None or not ref.inputs_finite:
        return None
    name = c.op_name
    if name in _AVERAGES:
        return _average(name, ref)
    if name in _DIVISIONS:
        return _division(c, ref)
    if name in _LOGS:
        return _log_of_zero(name, ref.inputs[0]) if ref.inputs else None
    if name in _POWERS:
        return _power(name, ref)
    if name in _OVERFLOWS and _only_inf(ref):
        return Diagnosis(
            f"an overflow of FP32 itself: {c.event.op} goes beyond its maximum {_FP32_MAX}",
            _OVERFLOWS[name],
        )
    return None


def _average(name: str, ref: OpEvent) -> Diagnosis | None:
    """A mean over no values is 0 / 0; an unbiased std or var over one value divides by
    N - 1 = 0. N is how many input values each result reduces."""
    if not ref.inputs or not ref.outputs:
        return None
    values, results = ref.inputs[0].numel, ref.outputs[0].numel
    if values == 0:
        return Diagnosis(
            f"a {_statistic(name)} over no values (0 / 0), as x[mask].{name}() where the mask "
            "selects nothing",
            "Guard the count: x[mask].sum() / mask.sum().clamp_min(1), or skip the term when "
            "mask.sum() == 0",
        )
    if name in _SPREAD and results and values // results == 1:
        return Diagnosis(
            f"an unbiased {_statistic(name)} of 1 value (N - 1 = 0 divides by 0): its input "
            f"{_shape(ref.inputs[0])} holds 1 value per result",
            f"Use the biased estimate: x.{_statistic(name)}(dim, correction=0) (unbiased=False), "
            "or take it only where the dimension holds more than one value (N > 1)",
        )
    return None


def _division(c: Candidate, ref: OpEvent) -> Diagnosis | None:
    """A division by a count (an integer, or the sum of a 0/1 mask) that is 0."""
    tensors = 1 if c.op_name == "rtruediv" else 2
    if len(ref.inputs) < tensors:
        return None  # x / 0.0: the divisor is a Python number
    divisor = ref.inputs[-1]
    if not _is_count(divisor, _producer(c, len(ref.inputs) - 1)):
        return None
    return Diagnosis(
        "a division by a count that is 0 (as mask.sum() when the mask selects nothing)",
        "Guard the count: x / n.clamp_min(1), or torch.where(n > 0, x / n, 0) where an empty "
        "selection must give 0",
    )


def _log_of_zero(name: str, arg: TensorStats) -> Diagnosis | None:
    """The log of 0 (no negative input): -inf, and a NaN after it."""
    if arg.min != 0 or not arg.zeros:
        return None
    log1p = ", or torch.log1p(x) for log(1 + x)" if name == "log" else ""
    return Diagnosis(
        f"the log of 0 (-inf): its input holds {arg.zeros} zeros and no negative number",
        f"Keep the input off 0: torch.{name}(x.clamp_min(eps)){log1p}",
    )


def _power(name: str, ref: OpEvent) -> Diagnosis | None:
    """A power's three failures: an overflow of FP32 (inf), 0 to a negative power (inf), a
    negative base to a fractional power (NaN). Only a Python float exponent is recorded: an
    integer one (``x.pow(2)``) is unknown here, and never makes a negative base NaN."""
    if name == "rpow":  # 2 ** x: the base is a Python number
        return _power_overflow(None) if _only_inf(ref) else None
    if not ref.inputs:
        return None
    base = ref.inputs[0]
    exponent = ref.scalars[0] if ref.scalars and name != "square" else None
    if _only_inf(ref):
        below_one = base.abs_max is not None and base.abs_max <= 1.0
        if base.zeros and below_one and (exponent is None or exponent < 0):
            return Diagnosis(
                f"0 to a negative power: the base holds {base.zeros} zeros",
                "Keep the base away from 0: x.clamp_min(eps) ** p",
            )
        return _power_overflow(base)
    fractional = exponent is None or exponent != int(exponent)
    if base.min is not None and base.min < 0 and fractional:
        return Diagnosis(
            f"a negative base to a fractional power: the base goes down to "
            f"{format_number(base.min)}",
            "Clamp the base before a fractional power: x.clamp_min(0) ** p",
        )
    return None


def _power_overflow(base: TensorStats | None) -> Diagnosis:
    reach = ""
    if base is not None and base.abs_max is not None:
        reach = f": its base reaches |x| = {format_number(base.abs_max)}"
    return Diagnosis(
        f"a power that overflows FP32 too, beyond its maximum {_FP32_MAX}{reach}",
        "Bring the base into range before the power (normalise it, or clip it: "
        "x.clamp(-c, c) ** p), or work in log space: p * torch.log(x.abs())",
    )


def _only_inf(ref: OpEvent) -> bool:
    """Inf and no NaN: a result too large, not an undefined one."""
    return any(s.posinf or s.neginf for s in ref.outputs) and not any(s.nan for s in ref.outputs)


def _is_count(divisor: TensorStats, producer: OpEvent | None) -> bool:
    """An integer or boolean tensor, or the sum of a 0/1 mask."""
    if not divisor.is_floating:
        return True
    if producer is None or producer.op.rsplit(".", 1)[-1].strip("_") not in _COUNTS:
        return False
    summed = producer.inputs[0] if producer.inputs else None
    return summed is not None and (
        not summed.is_floating or (summed.min is not None and summed.min >= 0 and (
            summed.max is not None and summed.max <= 1
        ))
    )


def _producer(c: Candidate, position: int) -> OpEvent | None:
    """The traced op that produced the op's input tensor at ``position``."""
    producers = c.event.producers
    index = producers[position] if position < len(producers) else None
    return next((p for p in c.input_producers if p.index == index), None)


def _statistic(name: str) -> str:
    return name.removesuffix("_mean")


def _shape(stats: TensorStats) -> str:
    return f"[{', '.join(str(s) for s in stats.shape)}]"
