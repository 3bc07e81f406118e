"""Independent fixes verified together: one re-scan per group, split only when it fails.

One-at-a-time verification (``verify.verify_fix``) re-scans the whole project once per fix.
Here the primary fixes of a report (then the alternatives of the findings whose primary is not
verified) are put into groups of *independent* fixes, and each group
is verified by ONE re-scan with all of its edits applied; every finding of the group is judged
against that re-scan with the same ``judge`` as one at a time (its op no longer fails, no error
the original scan lacked, the loss within ``LOSS_RTOL`` of the FP32 reference). When that
re-scan fails for any member, the members whose own op still fails are verified one at a time
and the others again together; when no failure is a member's own (a new error, a changed
loss, a re-scan that cannot run), the group is split in two and each half verified the same
way, down to single fixes, which are verified exactly as one at a time.

Two fixes are independent (``independent``) when all of these hold:

1. both findings are forward findings (a backward finding depends on everything after it);
2. their modules differ and neither contains the other (``a`` is not ``b`` or ``b.*``, and no
   finding is on the root module ``""``; a finding covering several modules: all of them);
3. their edits are in disjoint line ranges with at least one unedited line between them (each
   re-scan line maps through the combined line map to one fix's region, or to unedited code),
   and applying all edits together raises no ``EditConflict``;
4. the forward data-flow probe (``nan_hunter.fixes.dataflow``) saw no value computed in one
   fix's code (its edited lines and its finding's op line) reach an op in the other's, and
   each fix's edited lines ran in the probe (an edit outside the forward is never combined);
5. both fixes have the same applicability, so that ``--fix`` (which takes safe fixes, and
   unsafe ones only with ``--unsafe-fixes``) applies a verified group together or not at all.

When combining is sound: for fixes that are independent in this sense, the edits of the
others change neither the inputs nor the code of a fix's op, so in the combined re-scan that
op computes what it computes in its own re-scan: "the fixed op no longer fails" is the same
verdict. A new error or a changed loss in the combined re-scan cannot be attributed to one fix,
so it never verifies: the group is split, and the split ends in one-at-a-time verdicts. What a
passing group verifies beyond one at a time is the joint condition on the values downstream
of several fixes (the loss, ops that mix their outputs), which one at a time sees with the
other findings' errors still in them: when those errors reach the loss, a single fix's re-scan
has a non-finite loss and is never verified, while the group's re-scan, with all of them
fixed, has the FP32 loss. So a passing group's verdicts equal one-at-a-time verdicts whenever
the other findings' errors do not reach the loss (or any op both fixes' values reach); when
they do, the group verifies fixes that one at a time could not (``verified`` then means: with
the other fixes of its group, which ``--fix`` applies together).

Not seen by the probe, so outside this guarantee: values that pass through Python numbers
(``.item()``, ``.tolist()``, control flow on a tensor) from one fix's code to another's op, and
the backward pass (a gradient that reaches one fix's region through another's). A new error
these cause in the combined re-scan still splits the group; an error of one fix that another
fix's values hide there does not.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from nan_hunter.errors import NanHunterError
from nan_hunter.findings import Edit, Finding, Fix, Phase
from nan_hunter.fixes.dataflow import CodeRange, Dataflow
from nan_hunter.fixes.edits import EditConflict, combine, patch_files

Key = tuple[object, ...]


@dataclass(frozen=True)
class PendingFix:
    """A fix with edits to verify, with the finding it fixes; ``key`` as in the verdict cache."""

    key: Key
    finding: Finding
    fix: Fix

    @property
    def edits(self) -> tuple[Edit, ...]:
        return self.fix.edits


def code_of(candidate: PendingFix) -> list[CodeRange]:
    """The candidate's piece of code for the data-flow probe: its edited line ranges (original
    lines) and its finding's op line and call site."""
    ranges = [
        CodeRange(str(path.resolve()), first, last)
        for path, patched in patch_files(candidate.edits).items()
        for first, last in patched.line_map.edited_ranges()
    ]
    for where in (candidate.finding.location, candidate.finding.call_site):
        if where is not None:
            ranges.append(CodeRange(where.file, where.line, where.line, edited=False))
    return ranges


def _edited_lines(edits: Sequence[Edit]) -> dict[Path, list[tuple[int, int]]]:
    """Original line ranges ``(first, last)`` each file's edits replace (an insertion: the
    line it goes before)."""
    return {
        path.resolve(): patched.line_map.edited_ranges()
        for path, patched in patch_files(edits).items()
    }


def _contains(outer: str, inner: str) -> bool:
    return outer == inner or inner.startswith(outer + ".")


def independent(a: PendingFix, b: PendingFix, flow: Dataflow) -> bool:
    """The five conditions of the module docstring."""
    return may_combine(a, b) and flow.independent(a.key, b.key)


def may_combine(a: PendingFix, b: PendingFix) -> bool:
    """Conditions 1-3 and 5 (all but the data flow): what the report alone says."""
    fa, fb = a.finding, b.finding
    if a.fix.applicability is not b.fix.applicability:
        return False
    if fa.phase is not Phase.FORWARD or fb.phase is not Phase.FORWARD:
        return False
    modules_a, modules_b = fa.modules or (fa.module,), fb.modules or (fb.module,)
    if not all(modules_a) or not all(modules_b):  # "": the root module holds everything
        return False
    for x, y in itertools.product(modules_a, modules_b):
        if _contains(x, y) or _contains(y, x):
            return False
    try:
        lines_a, lines_b = _edited_lines(a.edits), _edited_lines(b.edits)
    except (NanHunterError, OSError):  # a file gone or changed: verified one at a time
        return False
    for file in lines_a.keys() & lines_b.keys():
        for (a1, a2), (b1, b2) in itertools.product(lines_a[file], lines_b[file]):
            if a1 <= b2 + 1 and b1 <= a2 + 1:  # overlapping or adjacent
                return False
    try:
        for _, edits in _by_file(a.edits + b.edits).items():
            combine(edits)
    except EditConflict:
        return False
    return True


def worth_probing(candidates: Sequence[PendingFix]) -> bool:
    """Some two candidates pass conditions 1-3 and 5: only then is the data-flow probe run."""
    return any(may_combine(a, b) for a, b in itertools.combinations(candidates, 2))


def _by_file(edits: Sequence[Edit]) -> dict[str, list[Edit]]:
    out: dict[str, list[Edit]] = {}
    for edit in edits:
        out.setdefault(edit.file, []).append(edit)
    return out


def groups(candidates: Sequence[PendingFix], flow: Dataflow | None) -> list[list[PendingFix]]:
    """Candidates in groups of mutually independent ones (first fit, in report order); every
    candidate alone when there is no data-flow probe."""
    out: list[list[PendingFix]] = []
    for candidate in candidates:
        home = None
        if flow is not None:
            home = next(
                (g for g in out if all(independent(candidate, c, flow) for c in g)), None
            )
        if home is None:
            out.append([candidate])
        else:
            home.append(candidate)
    return out


class _Verdict(Protocol):
    @property
    def verified(self) -> bool: ...

    @property
    def op_still_fails(self) -> bool: ...


V = TypeVar("V", bound=_Verdict)


def verify_groups(
    candidates: Sequence[PendingFix],
    flow: Dataflow | None,
    verify_one: Callable[[PendingFix], V],
    verify_together: Callable[[Sequence[PendingFix]], dict[Key, V] | None],
) -> dict[Key, V]:
    """A verdict per candidate key: each group by one re-scan, split when it fails.

    ``verify_one`` is one-at-a-time verification; ``verify_together`` re-scans the project with
    all the candidates' edits applied and judges each candidate against that one re-scan (None
    when the re-scan could not run)."""
    verdicts: dict[Key, V] = {}
    for group in groups(candidates, flow):
        verdicts.update(_verify(group, verify_one, verify_together))
    return verdicts


def _verify(
    group: Sequence[PendingFix],
    verify_one: Callable[[PendingFix], V],
    verify_together: Callable[[Sequence[PendingFix]], dict[Key, V] | None],
) -> dict[Key, V]:
    """How a failed group is split: the members whose own op still fails in the group's
    re-scan (their failure is theirs: no other member's values reach that op) are verified one
    at a time, the others again as a group; when no failure is a member's own (a new error, a
    changed loss, a re-scan that did not run), the group is halved."""
    if len(group) == 1:
        return {group[0].key: verify_one(group[0])}
    together = verify_together(group)
    if together is not None:
        if all(together[c.key].verified for c in group):
            return together
        own = [c for c in group if together[c.key].op_still_fails]
        if own:
            rest = [c for c in group if not together[c.key].op_still_fails]
            out = {c.key: verify_one(c) for c in own}
            if rest:
                out.update(_verify(rest, verify_one, verify_together))
            return out
    half = len(group) // 2
    return {
        **_verify(group[:half], verify_one, verify_together),
        **_verify(group[half:], verify_one, verify_together),
    }
