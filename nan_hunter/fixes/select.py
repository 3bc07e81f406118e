"""The one selection of fixes that ``--fix``, ``--diff``, ``--patch`` and the API share.

A finding's fix (or, failing that, the first of its alternatives) is chosen when it has edits,
its applicability is allowed (safe; unsafe with ``unsafe=True``, or without it when the re-scan
measured its change of the FP32 loss within the verification's tolerance; never display-only),
it was not refuted by a re-scan (a fix whose verification ran must be verified), and its edits
do not collide with the edits already chosen. Identical edits (the same op reached from several
calls, the same ``import torch``) count once. A verified unsafe fix passed over for a later safe
one is named (``Selection.passed_over``): the cheaper change the user may take.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nan_hunter.findings import Applicability, Edit, Finding, Fix, Report, loss_change_text
from nan_hunter.fixes.edits import EditConflict, by_file, combine


@dataclass(frozen=True)
class Selection:
    chosen: tuple[tuple[Finding, Fix], ...]
    skipped: tuple[tuple[Finding, str], ...]
    """Errors (and warnings with an edit) that get no fix, and why."""
    passed_over: tuple[tuple[Finding, Fix], ...] = ()
    """Verified unsafe fixes ranked before the fix chosen for their finding, not taken
    because ``unsafe`` is off and their measured change is beyond the tolerance."""

    @property
    def edits(self) -> tuple[Edit, ...]:
        return tuple(dict.fromkeys(e for _, fix in self.chosen for e in fix.edits))


def why_not(fix: Fix, unsafe: bool) -> str | None:
    """None when ``fix`` may be applied, else why not."""
    if not fix.edits:
        return "no automatic fix"
    if fix.applicability is Applicability.DISPLAY_ONLY:
        return "display-only advice"
    if fix.verified is False:
        # the first entry that failed the proof; errors the original scan had at the same
        # place, and the note on a group re-scan, do not
        reasons = [r for r in fix.remaining if not r.endswith(_NOT_A_REASON) and not (
            r.startswith(_GROUP_NOTE)
        )]
        reason = reasons[0] if reasons else "the finding remained"
        return f"not verified: {reason}"
    if fix.applicability is Applicability.UNSAFE and not unsafe and not fix.measured_harmless:
        if fix.verified is True and fix.fp32_loss_change is not None:
            return f"unsafe fix ({loss_change_text(fix.fp32_loss_change)}; use --unsafe-fixes)"
        return "unsafe fix (use --unsafe-fixes)"
    return None


_NOT_A_REASON = "(was there before)"
_GROUP_NOTE = "re-scanned together with"


def select_fixes(report: Report, *, unsafe: bool = False) -> Selection:
    chosen: list[tuple[Finding, Fix]] = []
    skipped: list[tuple[Finding, str]] = []
    passed_over: list[tuple[Finding, Fix]] = []
    taken: list[Edit] = []
    for finding in report.active:  # a suppressed finding is the user's call: never fixed
        if finding.fix is None:
            if finding.is_error:
                skipped.append((finding, "no automatic fix"))
            continue
        reasons = []
        earlier: list[Fix] = []
        for fix in (finding.fix, *finding.fix.alternatives):
            reason = why_not(fix, unsafe)
            if reason is None and not _fits(taken, fix.edits):
                reason = "overlaps another fix; run again or use --fix-all"
            if reason is None:
                chosen.append((finding, fix))
                taken.extend(fix.edits)
                passed_over.extend(
                    (finding, f) for f in earlier
                    if f.applicability is Applicability.UNSAFE and f.verified is True
                )
                break
            reasons.append(reason)
            earlier.append(fix)
        else:
            if finding.is_error or finding.fix.edits:
                unsafe_one = [r for r in reasons if "--unsafe-fixes" in r]
                reason = reasons[0]
                if unsafe_one and reason != unsafe_one[0]:
                    reason = f"{reason}; an unsafe fix is available (use --unsafe-fixes)"
                skipped.append((finding, reason))
    return Selection(tuple(chosen), tuple(skipped), tuple(passed_over))


def _fits(taken: Iterable[Edit], edits: Iterable[Edit]) -> bool:
    try:
        for file_edits in by_file([*taken, *edits]).values():
            combine(file_edits)
    except EditConflict:
        return False
    return True
