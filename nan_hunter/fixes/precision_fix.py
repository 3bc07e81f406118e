"""The fixes of a precision finding (NH601, NH602, NH603, NH609), to verify like any other.

First the rewrite its cause calls for (``nan_hunter.fixes.precision_rewrites``: an FP32
accumulator, FP32 positions, a form that does not cancel), then the FP32 candidates the range
rules use (``nan_hunter.fixes.build.build_fix`` on a candidate made from the precision
evidence): the elementwise ops from the last matmul/module up to the culprit upcast with no
region, the culprit alone in an FP32 region, its statement's region. Verification
(``nan_hunter.fixes.verify.judge``) re-scans each with the precision check and keeps the
least costly one after which no precision finding is left at the site, the loss is no further
from FP32's, and the loss's distance from FP32 or the largest op error at least halved.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nan_hunter.engine.analysis import low_precision_chain
from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.engine.precision_loss import op_name
from nan_hunter.findings import Applicability, Finding, Fix, Phase
from nan_hunter.fixes.build import build_fix, edit_site, make_fix
from nan_hunter.fixes.edits import edits_between
from nan_hunter.fixes.precision_rewrites import (
    CASTS,
    dropped_cast,
    fp32_accumulator,
    fp32_integers,
    stable_form,
)
from nan_hunter.fixes.source_file import SourceError, read_source
from nan_hunter.project.paths import is_installed, project_root
from nan_hunter.rules._precision import first_jump_after
from nan_hunter.rules.registry import FixPlan
from nan_hunter.trace.events import OpEvent

PRECISION_CODES = frozenset({"NH601", "NH602", "NH603", "NH609"})

_ACCUMULATOR_TITLE = "Accumulate in FP32: dtype=torch.float32 on {op}"
_STABLE_TITLE = "Compute {what}: the same value, without the {why}"
_INTEGERS_TITLE = "Make the integers in FP32 ({op} with torch.float32): exact up to 2**24"
_CASTS_TITLE = ", and keep FP32 the operands cast to {fmt} on their way to {jump} ({lines})"

_REGION_TITLE = (
    "Compute {op} and the ops that rounded its inputs in FP32 (.float() where they enter, "
    "autocast disabled where needed)"
)


def with_precision_fix(
    finding: Finding,
    scan: ScanEvidence,
    *,
    device: str,
    half_dtype: str | None,
    device_from_input: bool,
) -> Finding:
    """``finding`` (NH6xx, display-only advice) with fixes that edit the user's code: the
    rewrite of its cause first, then FP32 for the op and the elementwise ops that rounded its
    inputs. Unchanged where none can be made (an op inside an installed library, a line the
    rewrites do not recognise and no FP32 region fits)."""
    if finding.code not in PRECISION_CODES or scan.low is None or finding.op_index is None:
        return finding
    event = scan.low.events[finding.op_index]
    site = edit_site(event)
    if site is None or site is not event.location or is_installed(site.file):
        return finding
    path = Path(site.file).resolve()
    root = project_root(path)
    fixes: list[Fix] = []
    try:
        text = read_source(path).text
    except SourceError:
        return finding
    rewritten = _rewritten(finding, scan, event, text)
    if rewritten is not None:
        title, new_text = rewritten
        edits = edits_between(path, text, new_text)
        if edits:
            fixes.append(make_fix(title, Applicability.SAFE, edits, root))
    candidate = precision_candidate(scan, event)
    made_here = finding.code == "NH601" and not candidate.cast_inputs
    if not made_here:  # FP32 around integers the op itself makes keeps making them in BF16
        plan = FixPlan(title=_REGION_TITLE.format(op=event.op), region=True)
        region = build_fix(candidate, plan, device=device, site=site, half_dtype=half_dtype,
                           device_from_input=device_from_input)
        fixes += [f for f in (replace(region, alternatives=()), *region.alternatives) if f.edits]
    fixes = [f for i, f in enumerate(fixes) if all(f.edits != g.edits for g in fixes[:i])]
    if not fixes:
        return finding
    return replace(finding, fix=replace(fixes[0], alternatives=tuple(fixes[1:])))


def _rewritten(
    finding: Finding, scan: ScanEvidence, event: OpEvent, text: str
) -> tuple[str, str] | None:
    """``(title, new text)`` of the rewrite ``finding``'s cause calls for, or None. For
    integers past the exact range (NH601): the integers made in FP32, and the casts to the
    format of the operands they meet before the first op that loses precision on them
    (``self.inv_freq.to(h.dtype)`` in ``pos * inv_freq``) taken out: FP32 positions times a
    rounded frequency are still off by whole radians."""
    assert event.location is not None
    name = op_name(event)
    line = event.location.line
    if finding.code == "NH603":
        new_text = fp32_accumulator(text, line, name)
        return (_ACCUMULATOR_TITLE.format(op=event.op), new_text) if new_text else None
    if finding.code in ("NH602", "NH609"):
        stable = stable_form(text, line, name)
        if stable is None:
            return None
        why = "cancellation" if finding.code == "NH602" else "rounding of 1 + x"
        return _STABLE_TITLE.format(what=stable[1], why=why), stable[0]
    new_text = fp32_integers(text, line, name)
    if new_text is None:
        return None
    title = _INTEGERS_TITLE.format(op=event.op)
    measured = scan.precision.ops.get(event.index) if scan.precision is not None else None
    after = first_jump_after(scan, measured) if measured is not None else None
    if after is None:
        return title, new_text
    jump = after.event
    lines = []
    for cast in _casts_on_the_way(scan, event, jump):
        assert cast.location is not None
        dropped = dropped_cast(new_text, cast.location.line, op_name(cast))
        if dropped is not None:
            new_text = dropped
            lines.append(str(cast.location.line))
    if lines:
        title += _CASTS_TITLE.format(fmt=scan.fmt.name, jump=jump.op, lines="line " + ", ".join(
            dict.fromkeys(lines)))
    return title, new_text


def _casts_on_the_way(scan: ScanEvidence, site: OpEvent, jump: OpEvent) -> list[OpEvent]:
    """The casts of FP32 values to the format, in ``site``'s file, that feed ``jump`` after
    ``site`` (operands the integers meet on the way)."""
    assert scan.low is not None and site.location is not None
    chain = low_precision_chain(scan.low.events, jump, scan.fmt, scan.settings.upstream_depth)
    return [
        e for e in chain
        if e.index != site.index and op_name(e) in CASTS and e.inputs
        and e.inputs[0].dtype == "float32"
        and e.location is not None and e.location.file == site.location.file
    ]


def precision_candidate(scan: ScanEvidence, event: OpEvent) -> Candidate:
    """What the FP32 fix builders need to know of a precision finding's op: its FP32 run, the
    ops upstream in its file whose results were rounded (the values to take into FP32), and,
    for integers that autocast cast down (NH601 at a matmul), the positions of those inputs."""
    assert scan.low is not None
    p = scan.precision
    measured = p.ops.get(event.index) if p is not None else None
    casts = ()
    if measured is not None:
        casts = tuple(
            i for i in measured.integer_inputs
            if i < len(event.inputs) and event.inputs[i].dtype == "float32"
        )
    events = scan.low.events
    return Candidate(
        phase=Phase.FORWARD,
        event=event,
        fmt=scan.fmt,
        reference=measured.reference if measured is not None else None,
        cast_inputs=casts,
        own_inputs_finite=True,
        input_producers=tuple(events[i] for i in dict.fromkeys(event.producers) if i is not None),
        rounded_chain=low_precision_chain(events, event, scan.fmt, scan.settings.upstream_depth),
    )
