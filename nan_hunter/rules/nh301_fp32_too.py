"""NH301: non-finite in FP32 too: a real bug, not a precision problem."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._bug_causes import diagnose
from nan_hunter.rules._messages import output_damage
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number

_DOMAIN_HINTS = {
    "log": "the log of a negative number or of 0",
    "log2": "the log of a negative number or of 0",
    "log10": "the log of a negative number or of 0",
    "sqrt": "the square root of a negative number",
    "rsqrt": "the reciprocal square root of a negative number or of 0",
    "truediv": "a division by 0",
    "div": "a division by 0",
    "reciprocal": "the reciprocal of 0",
    "acos": "acos outside [-1, 1]",
    "asin": "asin outside [-1, 1]",
}
"""Causes by the op alone, where ``_bug_causes.diagnose`` cannot settle one from the evidence
(a power's cause is always decided there: an overflow is no domain error)."""


_BACKWARD_HINTS = {
    "sqrt": "sqrt at 0, whose gradient 1 / (2 sqrt(x)) is inf there (0 * inf is NaN), as in "
    "the norm of an all-zero vector",
    "rsqrt": "rsqrt at 0, whose gradient is inf there",
    "pow": "a fractional power at 0, whose gradient is inf there",
    "log": "log at 0, whose gradient 1 / x is inf there",
    "log2": "log2 at 0, whose gradient is inf there",
    "log10": "log10 at 0, whose gradient is inf there",
    "truediv": "a division by 0 (the gradient of x / d is -x / d**2)",
    "div": "a division by 0 (the gradient of x / d is -x / d**2)",
    "reciprocal": "the reciprocal of 0, whose gradient is -1 / x**2",
    "acos": "acos at -1 or 1, whose gradient is inf there",
    "asin": "asin at -1 or 1, whose gradient is inf there",
    "atan2": "atan2(0, 0), whose gradient is 0 / 0",
}
"""Causes of a gradient that is non-finite in FP32 where the forward value was finite."""

_BACKWARD_ADVICE = {
    "sqrt": "Add eps inside the root: torch.sqrt(x + eps) (a norm: torch.sqrt((h * h).sum(-1) "
    "+ eps)), or use torch.linalg.vector_norm, whose gradient at 0 is 0",
    "rsqrt": "Add eps inside: torch.rsqrt(x + eps)",
    "pow": "Keep the base away from 0: x.clamp_min(eps) ** p",
    "acos": "Keep the input inside the domain: torch.acos(x.clamp(-1 + eps, 1 - eps))",
    "asin": "Keep the input inside the domain: torch.asin(x.clamp(-1 + eps, 1 - eps))",
    "atan2": "Keep the arguments off (0, 0): torch.atan2(y, x + eps), or mask those entries",
}
"""Advice for those: the forward is fine, its derivative is not."""

_ADVICE = {
    "ctc_loss": "An input sequence is too short for its target (infinite CTC loss): pass "
    "zero_infinity=True to F.ctc_loss / nn.CTCLoss, or drop those samples",
    "log": "Clamp the input: torch.log(x.clamp_min(eps)), or use log_softmax / logsigmoid",
    "log2": "Clamp the input: torch.log2(x.clamp_min(eps))",
    "log10": "Clamp the input: torch.log10(x.clamp_min(eps))",
    "log1p": "Clamp the input above -1: torch.log1p(x.clamp_min(-1 + eps))",
    "sqrt": "Clamp the input: torch.sqrt(x.clamp_min(0) + eps)",
    "rsqrt": "Clamp the input: torch.rsqrt(x.clamp_min(eps))",
    "truediv": "Guard the denominator: x / d.clamp_min(eps), or torch.where(d != 0, x / d, 0)",
    "div": "Guard the denominator: x / d.clamp_min(eps), or torch.where(d != 0, x / d, 0)",
    "reciprocal": "Guard the input: torch.reciprocal(x.clamp_min(eps))",
    "acos": "Clamp the input into the domain: torch.acos(x.clamp(-1 + eps, 1 - eps))",
    "asin": "Clamp the input into the domain: torch.asin(x.clamp(-1 + eps, 1 - eps))",
    "cross_entropy": "A batch whose every target is ignore_index averages over no token (0/0): "
    "skip the loss when (target != ignore_index).sum() == 0, or use reduction='sum' and divide "
    "by a token count that is at least 1 (a global count, across ranks and accumulation steps)",
    "nll_loss": "A batch whose every target is ignore_index averages over no token (0/0): "
    "skip the loss when (target != ignore_index).sum() == 0, or use reduction='sum' and divide "
    "by a token count that is at least 1",
}
"""Advice that fits the op, for a non-finite result that is a real bug."""


def _hints(c: Candidate) -> dict[str, str]:
    """A gradient that is non-finite where its forward was finite has its own causes."""
    forward_finite = c.reference is None or c.reference.outputs_finite
    return _BACKWARD_HINTS if c.phase is Phase.BACKWARD and forward_finite else _DOMAIN_HINTS


def _operand(c: Candidate) -> str:
    """Name the operand that makes the op invalid, from the FP32 reference's inputs."""
    if c.constants:
        return f": a non-finite constant operand: {' and '.join(c.constants)}"
    inputs = c.reference.inputs if c.reference is not None else c.event.inputs
    if inputs and c.phase is Phase.BACKWARD and c.op_name in _BACKWARD_HINTS:
        zeros = inputs[0].zeros
        return f": its input holds {zeros} zeros" if zeros else ""
    if not inputs or c.phase is not Phase.FORWARD:
        return ""
    if c.op_name in ("log", "log2", "log10", "sqrt", "rsqrt"):
        first = inputs[0]
        if first.min is not None and first.min < 0:
            return f": its input goes down to {format_number(first.min)}"
        if first.min == 0:
            return ": its input contains 0"
    if c.op_name in ("truediv", "div", "reciprocal") and len(inputs) > 1:
        divisor = inputs[-1]
        if divisor.zeros:
            return f": the divisor holds {divisor.zeros} zeros"
    if any(not s.finite for s in inputs):
        return ": an input is already non-finite in FP32 (inf - inf, 0 * inf)"
    return ""


@register
class NonFiniteInFp32(Rule):
    code = "NH301"
    name = "non-finite-in-fp32"
    priority = 10
    kind = Kind.NAN
    summary = "The op is non-finite in FP32 as well: a real bug, not a precision problem."
    doc = """\
## What
The op's output is NaN or inf in the FP32 reference run too, with the same model and batch.

## Why
Precision is not the cause: no autocast setting, loss scale or BF16 will fix it. Common causes are
the log or square root of a negative number, the log of 0, a division by zero (a count such as
`mask.sum()` that is 0), the mean of an empty selection (0 / 0), an unbiased `std`/`var` of one
value (N - 1 = 0), the gradient of `sqrt` at 0 (the norm of an all-zero vector), a value beyond
FP32's maximum 3.4e38 (`x.pow(2)` of a value above 1.8e19, `exp` above 88.7), or inf - inf.
nan-hunter names the cause it reads from the op's FP32 inputs and outputs. An op that reads
a non-finite constant (`x * float('nan')`, a buffer holding inf) is one too, when what it makes
reaches the loss or the model's output (a `-inf` mask a softmax takes in is not reported).

## Example
```python
h = self.fc(x)                                # may be negative
y = torch.log(h)                              # NaN in FP32 and FP16 alike
```

## Fix
Guard the operand, as the finding's advice says for its cause: `torch.log(h.clamp_min(eps))`,
`torch.sqrt(v + eps)`, `x.std(dim, correction=0)`, `x / n.clamp_min(1)` for a count, a softplus,
or a check of the data. nan-hunter suggests no autocast patch for this rule.
"""

    def matches(self, c: Candidate) -> bool:
        # a non-finite constant is non-finite in any precision, with or without a reference
        return c.ref_finite is False or bool(c.constants)

    def kind_for(self, c: Candidate) -> Kind:
        stats = c.grad.produced if c.grad is not None else c.event.outputs
        return Kind.NAN if any(s.nan for s in stats) else Kind.INF

    def message(self, c: Candidate) -> str:
        head = f"{c.event.op} gets {output_damage(c)} in FP32 as well: not a precision problem"
        diagnosis = None if c.constants else diagnose(c)
        if diagnosis is not None:
            return f"{head}, likely {diagnosis.cause}"
        hint = _hints(c).get(c.op_name)
        cause = f", likely {hint}" if hint else ""
        return f"{head}{cause}{_operand(c)}"

    def fix(self, c: Candidate) -> FixPlan:
        if c.constants:
            return FixPlan(
                title=f"Replace the non-finite constant {' and '.join(c.constants)} with a finite "
                "value (a mask: torch.finfo(dtype).min), or keep what it makes away from the "
                "loss; no autocast fix"
            )
        diagnosis = diagnose(c)
        if diagnosis is not None:
            return FixPlan(title=f"{diagnosis.advice}; no autocast fix")
        backward = c.phase is Phase.BACKWARD
        advice = (_BACKWARD_ADVICE.get(c.op_name) if backward else None) or _ADVICE.get(
            c.op_name
        )
        if advice is not None:
            return FixPlan(title=f"{advice}; no autocast fix")
        hint = _hints(c).get(c.op_name)
        if hint is None:
            return FixPlan(
                title="Find what makes the op's input invalid in FP32 (a 0, a negative number, an"
                " inf from an earlier op) and guard it; no autocast fix"
            )
        return FixPlan(title=f"Guard the operand against {hint}; no autocast fix")
