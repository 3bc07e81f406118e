"""The one rule registry: every finding code nan-hunter can emit, with its documentation.

A rule classifies one candidate (an origin op, a warning site or a bad input) that the analysis
found: ``matches`` decides whether the rule explains it, ``message`` says what happened in one
sentence, ``fix`` says what to change. Rules are tried in registration order, most specific
first; the generic fallback is registered last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from nan_hunter.findings import Applicability, Finding, Fix, Kind, Phase, Severity
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import ScaleWindow
from nan_hunter.trace.events import GradEvent, OpEvent


@dataclass(frozen=True)
class Upstream:
    """An earlier op that made the culprit's inputs wrong in low precision only."""

    event: OpEvent
    reason: str
    """``"eps"``: a Python scalar that rounds to 0; ``"flush"``: values flushed to 0."""


@dataclass(frozen=True)
class FixPlan:
    """What a rule wants changed. ``region`` asks for an autocast-disabled region around the
    culprit line and ``extra_lines`` (producers of its bad operands); otherwise ``advice`` only."""

    title: str
    region: bool = False
    extra_lines: tuple[int, ...] = ()
    upcast_sites: tuple[tuple[int, str, int], ...] = ()
    """Further ``(line, op, n_operands)`` ops in the region whose operands need ``.float()``."""
    applicability: Applicability = Applicability.SAFE
    """How safe the edit is, as the rule judges it (display-only when no edit can be made)."""
    rewrite: str = ""
    """A one-token rewrite instead of a region (``nan_hunter.fixes.rewrites``): ``"finfo"``
    (a constant -> the dtype's limit), ``"bce_logits"`` (sigmoid + BCE -> with-logits),
    ``"scalar"`` (the number ``value`` -> ``literal``)."""
    rewrite_line: int = 0
    """The line of the rewrite in the culprit's file (0: the culprit's line)."""
    value: float = 0.0
    literal: str = ""
    fallback: FixPlan | None = None
    """The plan to use when this one's edit cannot be made."""
    alternatives: tuple[FixPlan, ...] = ()
    """Further fixes, usually less safe, offered with this one."""


@dataclass(frozen=True)
class Candidate:
    """Everything a rule may look at for one finding candidate."""

    phase: Phase
    event: OpEvent
    """The forward op (for a backward finding: the op whose backward produced the gradient)."""
    fmt: FloatFormat
    reference: OpEvent | None = None
    """The same op in the FP32 reference run."""
    grad: GradEvent | None = None
    ref_grad: GradEvent | None = None
    cast_inputs: tuple[int, ...] = ()
    """Positions of FP32 inputs beyond the format's range that autocast cast down."""
    upstream: Upstream | None = None
    own_inputs_finite: bool | None = None
    producer_lines: tuple[int, ...] = ()
    """Lines (same file) of the ops that produced the out-of-range operands."""
    ref_backward_finite: bool | None = None
    """For a backward op with no backward node in FP32: whether the whole FP32 backward was."""
    scale_window: ScaleWindow | None = None
    """Loss scales that keep the FP16 gradients healthy (emulated backward only)."""
    grad_scale: float = 1.0
    """The loss scale the backward ran with."""
    input_producers: tuple[OpEvent, ...] = ()
    """The ops that produced this op's inputs (forward only)."""
    out_of_range_consumers: tuple[OpEvent, ...] = ()
    """Ops after this one (same file) whose FP32 values are still beyond the format's range,
    and the first that brings them back: where a half-mode region must end."""
    rounded_chain: tuple[OpEvent, ...] = ()
    """When FP32 fails on the op's own low-precision inputs: the ops upstream, in the same
    file, whose results were rounded to the low-precision format (the region grows to them)."""
    contained: bool = False
    """The non-finite values only reach integer/boolean results: harmless to training."""

    @property
    def ref_finite(self) -> bool | None:
        if self.phase is Phase.BACKWARD:
            if self.ref_grad is None:
                return self.ref_backward_finite
            return all(s.finite for s in self.ref_grad.produced)
        if self.reference is None:
            return None
        return self.reference.outputs_finite

    @property
    def ref_abs_max(self) -> float | None:
        stats = self.ref_grad.produced if self.phase is Phase.BACKWARD and self.ref_grad else (
            self.reference.outputs if self.reference else ()
        )
        values = [s.abs_max for s in stats if s.abs_max is not None]
        return max(values) if values else None

    @property
    def op_name(self) -> str:
        return self.event.op.rsplit(".", 1)[-1].strip("_")


class Rule:
    code: str = ""
    name: str = ""
    priority: int = 50
    """Lower is tried first by ``classify``: specific rules before the generic fallback."""
    severity: Severity = Severity.ERROR
    kind: Kind = Kind.NAN
    summary: str = ""
    doc: str = ""
    """Markdown with the sections What / Why / Example / Fix, shown by ``nan-hunter explain``."""

    def matches(self, c: Candidate) -> bool:
        raise NotImplementedError

    def kind_for(self, c: Candidate) -> Kind:
        return self.kind

    def message(self, c: Candidate) -> str:
        raise NotImplementedError

    def fix(self, c: Candidate) -> FixPlan | None:
        return None


def advice_finding(
    rule: Rule,
    event: OpEvent,
    *,
    phase: Phase,
    message: str,
    fix_title: str | None,
    module: str | None = None,
    stats: bool = True,
) -> Finding:
    """A warning that is not an origin (NH402, NH501, NH502): located at ``event``, with
    display-only advice."""
    return Finding(
        code=rule.code,
        severity=Severity.WARNING,
        kind=rule.kind,
        phase=phase,
        op=event.op,
        module=event.module if module is None else module,
        location=event.location,
        origin=False,
        message=message,
        fix=Fix(fix_title, Applicability.DISPLAY_ONLY) if fix_title else None,
        inputs=event.inputs if stats else (),
        outputs=event.outputs if stats else (),
        op_index=event.index,
    )


_REGISTRY: dict[str, Rule] = {}
R = TypeVar("R", bound=type[Rule])


def register(cls: R) -> R:
    """Class decorator: add one instance of the rule to the registry; codes are unique."""
    rule = cls()
    if not rule.code or rule.code in _REGISTRY:
        raise ValueError(f"rule code {rule.code!r} is empty or registered twice")
    _REGISTRY[rule.code] = rule
    return cls


def all_rules() -> list[Rule]:
    _load_rules()
    return sorted(_REGISTRY.values(), key=lambda r: r.code)


def get_rule(code: str) -> Rule | None:
    _load_rules()
    return _REGISTRY.get(code.upper())


def classify(c: Candidate, codes: Callable[[Rule], bool] = lambda r: True) -> Rule:
    """The most specific registered rule that explains ``c`` (rules sorted by priority)."""
    _load_rules()
    for rule in sorted(_REGISTRY.values(), key=_priority):
        if codes(rule) and rule.matches(c):
            return rule
    raise LookupError(f"no rule matches {c.event.op}")  # the fallback rule always matches


def _priority(rule: Rule) -> tuple[int, str]:
    return (rule.priority, rule.code)


def _load_rules() -> None:
    from nan_hunter.rules import catalog  # noqa: F401  (importing registers the rules)
