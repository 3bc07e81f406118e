"""The one rule registry: every finding code nan-hunter can emit, with its documentation.

Every rule is a detector, of one of two kinds:

* an origin rule (``Rule``) classifies one origin candidate that the analysis found (the first
  op to go inf/NaN): ``matches`` decides whether the rule explains it, ``message`` says what
  happened in one sentence, ``fix`` says what to change. ``classify`` tries them by
  ``priority``, most specific first; the generic fallback comes last.
* a site rule (``SiteRule``) finds its own sites in the whole scan (``detect``): a bad input
  before any pass (stage ``"inputs"``), a warning after the low-precision pass (``"pass"``), or
  what no other rule's error explains, after them all (``"final"``).

Rules live one per module, ``rules/nh<code>_<name>.py``, and register themselves with
``@register``; the registry imports every such module of the package on first use.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nan_hunter.core.location import SourceLocation
from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.findings import (
    Applicability,
    Finding,
    Fix,
    Fp32Rerun,
    Kind,
    OpRef,
    Phase,
    Severity,
)
from nan_hunter.rules._notes import CONTAINED, absorbed, bf16_alternative
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.summary import TensorStats


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
    ``"scalar"`` (the number ``value`` -> ``literal``), ``"custom_function"`` (the custom
    ``autograd.Function`` whose ``def backward`` is on the line runs in FP32: ``torch.amp``'s
    ``custom_fwd``/``custom_bwd``)."""
    rewrite_line: int = 0
    """The line of the rewrite in the culprit's file (0: the culprit's line)."""
    value: float = 0.0
    literal: str = ""
    fallback: FixPlan | None = None
    """The plan to use when this one's edit cannot be made."""
    alternatives: tuple[FixPlan, ...] = ()
    """Further fixes, usually less safe, offered with this one."""
    leads: bool = False
    """An alternative that changes the cause itself (an eps FP16 flushes to 0, a constant it
    cannot hold): it comes before the plan it is an alternative of. An FP32 region around a
    norm used throughout the network is AMP off for the model; the constant is the change the
    cause calls for. Usually unsafe: its verification measures by how much it changes the
    FP32 loss, and the defaults take it when that is within the tolerance."""


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


class SiteRule(Rule):
    """A rule that finds its own sites in the whole scan instead of classifying an origin."""

    stage: str = "pass"
    """``"inputs"``: run on the batch before any pass; ``"pass"``: after the low-precision
    pass (warnings); ``"final"``: after every other rule, whose errors it reads
    (``ScanEvidence.errors``)."""

    keeps_module_in_fp32: bool = False
    """Under ``model.half()``: whether keeping the module of a finding's site in FP32 is a fix
    (its own parameters or buffers are what the cast ruins); the engine then offers it, for
    verification, beside the rule's own fix."""

    def matches(self, c: Candidate) -> bool:
        return False  # never the explanation of an origin

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        raise NotImplementedError


def origin_finding(
    rule: Rule, c: Candidate, *, fix: Fix | None, call_site: SourceLocation | None
) -> Finding:
    """The finding for an origin candidate that ``rule`` explains, with the ``fix`` built for it
    and ``call_site`` (where the edit goes, when not the op's own line)."""
    event = c.event
    fp32 = None
    if c.ref_finite is not None:
        fp32 = Fp32Rerun(finite=c.ref_finite, abs_max=c.ref_abs_max,
                         own_inputs_finite=c.own_inputs_finite)
    upstream = None
    if c.upstream is not None:
        up = c.upstream.event
        upstream = OpRef(op=up.op, module=up.module, location=up.location, reason=c.upstream.reason)
    severity, notes = rule.severity, bf16_alternative(c, rule.kind_for(c))
    if c.contained:
        severity, notes = Severity.INFO, (CONTAINED,)
    elif c.absorbed_by and severity is Severity.ERROR:
        severity, notes = Severity.WARNING, (absorbed(c), *notes)
    return Finding(
        code=rule.code,
        severity=severity,
        kind=rule.kind_for(c),
        phase=c.phase,
        op=event.op,
        module=event.module,
        location=event.location,
        origin=True,
        message=rule.message(c),
        fp32_rerun=fp32,
        fix=fix,
        inputs=event.inputs if c.grad is None else c.grad.incoming,
        outputs=event.outputs if c.grad is None else c.grad.produced,
        upstream=upstream,
        op_index=event.index,
        notes=notes,
        call_site=call_site,
    )


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


def model_finding(
    rule: Rule,
    *,
    phase: Phase,
    message: str,
    fix_title: str,
    module: str = "",
    origin: bool = False,
    inputs: tuple[TensorStats, ...] = (),
    modules: tuple[str, ...] = (),
) -> Finding:
    """A finding no op made (the batch, the backward as a whole, ops the tracer did not see,
    training steps): no op, no location, display-only advice, with ``rule``'s severity."""
    return Finding(
        code=rule.code,
        severity=rule.severity,
        kind=rule.kind,
        phase=phase,
        op="",
        module=module,
        location=None,
        origin=origin,
        message=message,
        fix=Fix(fix_title, Applicability.DISPLAY_ONLY),
        inputs=inputs,
        modules=modules,
    )


_REGISTRY: dict[str, Rule] = {}
_LOADED = False
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


def site_rules(stage: str) -> list[SiteRule]:
    """The site rules of ``stage`` (``"inputs"``, ``"pass"`` or ``"final"``), by priority."""
    _load_rules()
    rules = sorted(_REGISTRY.values(), key=_priority)
    return [r for r in rules if isinstance(r, SiteRule) and r.stage == stage]


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
    """Import every rule module of this package once (``nh<code>_<name>.py``): importing one
    registers its rule. Two modules with the same code are an error (``register``)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name.startswith("nh"):
            importlib.import_module(f"{__package__}.{module.name}")
