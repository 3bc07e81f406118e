"""What a fix costs, and which of a finding's verified candidates to keep.

A candidate's verifying re-scan traces every op with its dtype and shapes; its cost is how much
of the forward's matmul/conv FLOPs (and, second, of its elementwise work) it moves into FP32,
relative to the original scan (``nan_hunter.precision.work``). Among the candidates that verify,
the one kept is the safest, then the cheapest, then the one with the smallest diff: the least
FP32 that works, not the first rung of the ladder that verifies. A change of the cause itself
(an eps FP16 holds) moves nothing to FP32: measured harmless, it ranks with the safe fixes and
wins on cost. A candidate whose edits cover
those of a verified one (the same lines and more: the statement around an op, the function
around a statement) cannot cost less, and is not re-scanned (``covers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nan_hunter.findings import Applicability, Finding, Fix, FixCost, Report
from nan_hunter.fixes.edits import patch_files
from nan_hunter.precision.work import PrecisionWork

_SAFETY = {Applicability.SAFE: 0, Applicability.UNSAFE: 1, Applicability.DISPLAY_ONLY: 2}


def fix_cost(before: Report, after: Report) -> FixCost | None:
    """The cost of the fix (or fixes) whose re-scan is ``after``; None when either scan has no
    measure of its work."""
    if before.precision is None or after.precision is None:
        return None
    return _cost(before, after.precision, after.precision.fp32_matmul_flops,
                 after.precision.fp32_elementwise, shared=False)


def shared_cost(
    before: Report, after: Report, finding: Finding, others: Sequence[Finding]
) -> FixCost | None:
    """The cost of ``finding``'s fix when ``after`` is the re-scan of several independent fixes
    (their findings in different modules, neither inside the other): the original FP32 work,
    plus the increase in the modules that are, hold or lie inside ``finding``'s modules.
    The increase in a module holding several of the findings is counted for each of them."""
    if before.precision is None or after.precision is None:
        return None
    if not others:
        return fix_cost(before, after)
    mine = finding.modules or (finding.module,)
    flops = before.precision.fp32_matmul_flops
    values = before.precision.fp32_elementwise
    for module in {m.module for m in (*before.precision.modules, *after.precision.modules)}:
        if not any(_related(module, m) for m in mine):
            continue
        was, now = before.precision.of(module), after.precision.of(module)
        flops += now.fp32_matmul_flops - was.fp32_matmul_flops
        values += now.fp32_elementwise - was.fp32_elementwise
    return _cost(before, after.precision, flops, values, shared=True)


def _related(a: str, b: str) -> bool:
    return a == b or not a or not b or a.startswith(b + ".") or b.startswith(a + ".")


def _cost(
    before: Report, after: PrecisionWork, flops: int, values: int, *, shared: bool
) -> FixCost:
    def share(part: int, whole: int) -> float:
        return min(max(part / whole, 0.0), 1.0) if whole else 0.0

    assert before.precision is not None
    return FixCost(
        fp32_matmul_share=share(flops, after.matmul_flops),
        fp32_elementwise_share=share(values, after.elementwise),
        baseline_matmul_share=before.precision.fp32_matmul_share,
        baseline_elementwise_share=before.precision.fp32_elementwise_share,
        shared=shared,
        low_precision=_FORMAT_NAMES.get(before.target.dtype, before.target.dtype),
    )


_FORMAT_NAMES = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}


def diff_size(fix: Fix) -> int:
    """The lines a fix's diff adds and removes."""
    if not fix.diff:
        return 0
    return sum(
        1 for line in fix.diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def safety(fix: Fix) -> int:
    """0 for a safe fix and for an unsafe one measured harmless (``Fix.measured_harmless``:
    verified, its FP32 loss change within the tolerance, what ``--fix`` takes by default),
    1 unsafe, 2 display-only: lower ranks first."""
    return 0 if fix.measured_harmless else _SAFETY[fix.applicability]


def rank(fix: Fix) -> tuple[bool, int, float, float, int]:
    """The order of a finding's verified candidates: safest, then cheapest, then smallest;
    but one that moves most of the model to FP32 (``FixCost.most_of_the_model``) after every
    cheaper one, an unsafe one included. ``--fix`` without ``--unsafe-fixes`` still takes the
    safe one then, and names the cheaper unsafe one it passed over (``select``)."""
    heavy = fix.cost is not None and fix.cost.most_of_the_model
    cost = fix.cost.rank if fix.cost is not None else (1.0, 1.0)
    return (heavy, safety(fix), *cost, diff_size(fix))


def covers(wider: Fix, narrower: Fix) -> bool:
    """``wider`` keeps at least what ``narrower`` keeps in FP32, as far as the lines show: in
    every file ``narrower`` edits, each line range it replaces (beyond the edits both make, an
    ``import torch``) lies within the span of ``wider``'s edits there (a statement around an
    op, a function or a kept module around a statement), or it keeps in FP32 a module that is or
    holds the one ``narrower`` keeps (``Fix.fp32_module``: a library submodule's parent, the
    whole library call). Such a candidate cannot cost less."""
    if wider.fp32_module is not None and narrower.fp32_module is not None:
        inner, outer = narrower.fp32_module, wider.fp32_module
        return not outer or inner == outer or inner.startswith(outer + ".")
    try:
        outer = _ranges(wider)
        inner = _ranges(narrower)
    except (OSError, ValueError):
        return False
    if not inner:
        return False
    for path, ranges in inner.items():
        own = [r for r in ranges if r not in outer.get(path, [])]
        rest = [r for r in outer.get(path, []) if r not in ranges]
        if not own:
            continue
        if not rest:
            return False
        low, high = min(a for a, _ in rest), max(b for _, b in rest)
        if not all(low <= first and last <= high for first, last in own):
            return False
    return True


def _ranges(fix: Fix) -> dict[object, list[tuple[int, int]]]:
    return {
        path.resolve(): patched.line_map.edited_ranges()
        for path, patched in patch_files(fix.edits).items()
    }


def choose(fix: Fix) -> Fix:
    """A finding's fix after its search (``fix`` and its alternatives carrying their
    verdicts): the best verified candidate with edits first, the other verified ones after it
    in rank order. Candidates refuted or not tried are left out once one is verified (a
    verified fix never showed alternatives), except refuted ones safer than the chosen one:
    they stay first, so that ``--fix`` without ``--unsafe-fixes`` says why no safe fix was
    taken. Nothing verified: ``fix`` as it was. A fix without edits (advice) stays first: only
    its alternatives are ordered."""
    if not fix.edits:
        verified = sorted((a for a in fix.alternatives if a.verified), key=rank)
        if not verified:
            return fix
        return replace(fix, alternatives=(*verified, *(
            a for a in fix.alternatives if not a.verified
        )))
    candidates = [replace(fix, alternatives=()), *_flat(fix.alternatives)]
    verified = sorted((c for c in candidates if c.edits and c.verified), key=rank)
    if not verified:
        return fix
    safer = [c for c in candidates if c.verified is False and safety(c) < safety(verified[0])]
    ordered = [*safer, *verified]
    return replace(ordered[0], alternatives=tuple(ordered[1:]))


def _flat(fixes: Sequence[Fix]) -> list[Fix]:
    """Fixes and their alternatives, depth first, each without alternatives."""
    return [g for f in fixes for g in (replace(f, alternatives=()), *_flat(f.alternatives))]
