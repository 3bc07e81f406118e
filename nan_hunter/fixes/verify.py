"""Verification that can't be fooled: re-scan the project with the fix applied, and compare.

The patched files are overlaid on the user's project: a temporary tree mirrors the project
root with symbolic links, except the folders leading to the patched files and the entry file,
which are real. The *original entry file* is re-scanned from there, so packages, relative
imports, ``Path(__file__)`` data files and lazy sibling imports keep working; modules the first
scan imported from the project are set aside for the re-scan and put back after it.

A fix is verified only when the re-scan has no error at the same op and module whose location
maps, through the edits' line map, into an edited region, and no error the original scan did
not have (compared through the same map, never by finding code). What remains is listed.

Fixes that are independent are verified together, one re-scan per group, and one at a time
only when their group's re-scan fails (``nan_hunter.fixes.grouping`` says when combining is
sound); that needs a ``Probe`` of the model's data flow, without one every fix is re-scanned
on its own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from nan_hunter.core.progress import announce
from nan_hunter.errors import NanHunterError
from nan_hunter.findings import (
    LOSS_RTOL,
    Finding,
    Fix,
    FixCost,
    Kind,
    PrecisionVerdict,
    Report,
    SourceLocation,
    percent_text,
)
from nan_hunter.fixes.cost import choose, covers, fix_cost, safety, shared_cost
from nan_hunter.fixes.dataflow import CodeRange, Dataflow
from nan_hunter.fixes.edits import PatchedFile, patch_files
from nan_hunter.fixes.grouping import Key, PendingFix, code_of, verify_groups, worth_probing
from nan_hunter.precision.formats import format_for
from nan_hunter.project.paths import is_installed, real_path, shared_root

Rescan = Callable[[Path], Report]
"""Scans an entry file with the options of the original scan (without verifying)."""

Probe = Callable[[Mapping[Key, Sequence[CodeRange]]], Dataflow]
"""Runs the model's forward and loss once under ``nan_hunter.fixes.dataflow.probe_dataflow``
with the given pieces of code."""

_OWN_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Verdict:
    verified: bool
    remaining: tuple[str, ...]
    op_still_fails: bool = False
    """The re-scan has an error at the fixed op itself (a failure of this fix alone, when it
    was re-scanned with independent fixes: see ``nan_hunter.fixes.grouping``)."""
    cost: FixCost | None = None
    """What the re-scan moved to FP32 (``nan_hunter.fixes.cost``)."""
    fp32_loss_change: float | None = None
    """The patched model's FP32 loss relative to the original's (``fp32_loss_change``)."""


MAX_RESCANS = 6
"""The re-scans one finding's search may make (each candidate verified, alone or in a group,
is one; a group's re-scan counts for each of its findings)."""


def verify_fixes(
    report: Report, rescan: Rescan, entry: Path, probe: Probe | None = None
) -> Report:
    """``report`` with every finding's fix searched: its candidates (the fix with edits and
    its alternatives, finest first) re-scanned in that order, each finding's next one in one
    round, ``verified``, ``remaining`` and ``cost`` set on those tried, and the least costly
    verified one kept as the finding's fix (``nan_hunter.fixes.cost.choose``). A finding's
    search stops when it has made ``MAX_RESCANS`` re-scans or when no candidate left could
    rank before its best verified one (a less safe one, or one covering a verified one's
    lines: it cannot cost less). With ``probe``, each round's candidates are verified in
    groups of independent fixes (one re-scan per group)."""
    searches = [
        _Search(finding) for finding in report.findings
        if finding.fix is not None and (finding.fix.edits or finding.fix.alternatives)
        and finding.suppression is None
    ]
    cache: dict[Key, Verdict] = {}
    spent: Counter[object] = Counter()
    flow = None
    everything = list({c.key: c for s in searches for c in s.candidates}.values())
    if probe is not None and worth_probing(everything):
        flow = _dataflow(everything, probe)

    def verify_one(c: PendingFix) -> Verdict:
        spent[_budget_key(c)] += 1
        return verify_fix(c.fix, c.finding, report, rescan, entry)

    def together(group: Sequence[PendingFix]) -> dict[Key, Verdict] | None:
        for key in {_budget_key(c) for c in group}:
            spent[key] += 1
        return verify_together(group, report, rescan, entry)

    while True:
        pending: dict[Key, PendingFix] = {}
        for search in searches:
            if not search.candidates or spent[_budget_key(search.candidates[0])] >= MAX_RESCANS:
                continue
            nxt = search.next(cache)
            if nxt is not None:
                pending.setdefault(nxt.key, nxt)
        if not pending:
            break
        cache.update(verify_groups(list(pending.values()), flow, verify_one, together))
    findings = []
    for finding in report.findings:
        search = next((s for s in searches if s.finding is finding), None)
        if search is not None and finding.fix is not None:
            finding = replace(finding, fix=choose(_with_verdicts(finding.fix, finding, cache)))
        findings.append(finding)
    return replace(report, findings=tuple(findings))


def _budget_key(c: PendingFix) -> object:
    return (c.finding.op, c.finding.module, c.finding.location, c.finding.phase)


class _Search:
    """One finding's candidates with edits, in the order they are tried (finest first)."""

    def __init__(self, finding: Finding) -> None:
        assert finding.fix is not None
        self.finding = finding
        self.candidates = [
            PendingFix(_key(f, finding), finding, f) for f in _ladder(finding.fix) if f.edits
        ]

    def next(self, cache: Mapping[Key, Verdict]) -> PendingFix | None:
        """The first candidate not tried yet that could rank before every verified one."""
        verified = [c for c in self.candidates if c.key in cache and cache[c.key].verified]
        judged = [_judged(c.fix, cache[c.key]) for c in verified]
        if any(f.measured_harmless for f in judged):
            return None  # the cause's own change, measured harmless: it moves nothing to FP32
        best = min((safety(f) for f in judged), default=None)
        for c in self.candidates:
            if c.key in cache:
                continue
            if best is not None and safety(c.fix) > best:
                continue  # less safe than a verified fix: never ranked before it
            if any(
                covers(c.fix, v.fix) and safety(c.fix) >= safety(_judged(v.fix, cache[v.key]))
                for v in verified
            ):
                continue  # it holds a verified one's lines: it cannot cost less, nor be safer
            return c
        return None


def _ladder(fix: Fix) -> list[Fix]:
    """``fix`` and its alternatives (and theirs), depth first: the order they are tried in."""
    return [fix, *(f for alt in fix.alternatives for f in _ladder(alt))]


def _with_verdicts(fix: Fix, finding: Finding, cache: Mapping[Key, Verdict]) -> Fix:
    """``fix`` and its alternatives with the verdicts their re-scans gave (none: not tried)."""
    verdict = cache.get(_key(fix, finding)) if fix.edits else None
    if verdict is not None:
        fix = _judged(fix, verdict)
    return replace(fix, alternatives=tuple(
        _with_verdicts(alt, finding, cache) for alt in fix.alternatives
    ))


def _judged(fix: Fix, verdict: Verdict) -> Fix:
    """``fix`` with what its re-scan said."""
    return replace(fix, verified=verdict.verified, remaining=verdict.remaining,
                   cost=verdict.cost, fp32_loss_change=verdict.fp32_loss_change)


def _key(fix: Fix, finding: Finding) -> Key:
    return (frozenset(fix.edits), finding.op, finding.module)


def _dataflow(candidates: Sequence[PendingFix], probe: Probe) -> Dataflow | None:
    """The probe's answer, or None (every fix verified on its own) when it cannot run."""
    try:
        return probe({c.key: code_of(c) for c in candidates})
    except Exception:  # the user's model failed outside a scan: each fix on its own
        return None


def verify_together(
    group: Sequence[PendingFix], report: Report, rescan: Rescan, entry: Path
) -> dict[Key, Verdict] | None:
    """ONE re-scan of ``entry``'s project with every fix of ``group`` applied, each finding
    judged against it; None when the re-scan cannot run (the group is then split)."""
    try:
        patched = patch_files(e for c in group for e in c.edits)
        root = shared_root([entry, *patched])
        announce(f"verifying {len(group)} independent fixes: one re-scan of a patched copy")
        with overlay(root, patched, entry) as (shadow_entry, back):
            after = rescan(shadow_entry)
        after = _mapped_back(after, back)
    except (NanHunterError, OSError):
        return None
    verdicts = {}
    for c in group:
        verdict = judge(c.finding, report, after, patched)
        others = ", ".join(o.finding.module for o in group if o is not c)
        note = f"re-scanned together with the independent fixes for {others}"
        cost = shared_cost(report, after, c.finding, [o.finding for o in group if o is not c])
        verdicts[c.key] = replace(verdict, remaining=(*verdict.remaining, note), cost=cost)
    return verdicts


def verify_fix(
    fix: Fix, finding: Finding, report: Report, rescan: Rescan, entry: Path
) -> Verdict:
    """Re-scan ``entry``'s project with ``fix`` applied and judge the result."""
    try:
        patched = patch_files(fix.edits)
        root = shared_root([entry, *patched])
        announce("verifying a fix: re-scan of a patched copy")
        with overlay(root, patched, entry) as (shadow_entry, back):
            after = rescan(shadow_entry)
        after = _mapped_back(after, back)
    except (NanHunterError, OSError) as exc:
        return Verdict(False, (f"the re-scan failed: {exc}",))
    return replace(judge(finding, report, after, patched), cost=fix_cost(report, after))


def judge(
    finding: Finding, before: Report, after: Report, patched: dict[Path, PatchedFile]
) -> Verdict:
    """Verified when no re-scan error is the fixed op inside an edited region, and every
    re-scan error is one the original scan had at the same op, module and original line."""
    old_errors = [f for f in before.findings if f.is_error]
    verified, still_fails, remaining = _against(
        [f for f in after.findings if f.is_error], finding,
        [h for h in old_errors if h is not finding], patched,
        any_op=False, still="the fixed op still fails",
    )  # fmt: skip
    if finding.kind is Kind.PRECISION:
        held, fails, notes = _precision_judged(finding, before, after, patched)
        verified, still_fails = verified and held, still_fails or fails
        remaining += notes
    changed = loss_change(before, after)
    if changed is not None:
        verified = False
        remaining.append(changed)
    return Verdict(verified, tuple(remaining), still_fails,
                   fp32_loss_change=fp32_loss_change(before, after))


def _against(
    found: list[Finding], finding: Finding, old: list[Finding],
    patched: dict[Path, PatchedFile], *, any_op: bool, still: str,
) -> tuple[bool, bool, list[str]]:
    """The re-scan's ``found`` against the fix of ``finding``: ``(held, the fixed op still
    fails, notes)``. One at the fixed op (or, with ``any_op``, anywhere in the edited code)
    fails it (``still`` says how); one of ``old``, the original scan's, at the same op, module
    and original line, was there before; any other is new and fails it too."""
    held, fails, notes = True, False, []
    for g in found:
        place = _original_place(g.location, patched)
        edited = place is not None and place[3]
        at_fix = edited and (any_op or (g.op, g.module) == (finding.op, finding.module))
        if at_fix or _same_site(finding, g, place):
            held, fails = False, True
            notes.append(f"{_describe(g)} ({still})")
        elif any(_same_site(h, g, place) for h in old):
            notes.append(f"{_describe(g)} (was there before)")
        else:
            held = False
            notes.append(f"{_describe(g)} (new: the original scan did not have it)")
    return held, fails, notes


def _precision_judged(
    finding: Finding, before: Report, after: Report, patched: dict[Path, PatchedFile]
) -> tuple[bool, bool, list[str]]:
    """A precision finding's fix, judged by the re-scan's precision check: ``(held, the fixed
    op still fails, notes)``. It holds when no precision warning is left at the fixed op, in an
    edited region or one the original scan did not have, the re-scan compared the ops at all,
    and the loss is no further from FP32's than before (within one rounding of the format)."""
    held, fails, notes = _against(
        [f for f in after.findings if f.kind is Kind.PRECISION], finding,
        [f for f in before.findings if f.kind is Kind.PRECISION and f is not finding], patched,
        any_op=True, still="precision is still lost at the fixed code",
    )  # fmt: skip
    was, now = before.precision_check, after.precision_check
    if finding.code != "NH603" and (now is None or now.compared == 0):
        return False, fails, [*notes, "the re-scan compared no op with FP32: nothing measured"]
    if was is not None and now is not None and was.loss_error is not None:
        if now.loss_error is None:  # a loss that is not finite: ``loss_change`` says so
            return False, fails, [*notes, "the loss's distance from FP32 is not measured after "
                                          "the fix"]
        rounding = format_for(before.target.dtype).unit_roundoff
        if now.loss_error > was.loss_error + rounding:
            held = False
            notes.append(
                f"the loss is further from FP32's: off by {percent_text(now.loss_error)} after "
                f"the fix, {percent_text(was.loss_error)} before"
            )
        elif not _lost_before(was, rounding):
            notes.append(
                f"nothing was measurably lost before it (the loss off FP32's by "
                f"{percent_text(was.loss_error)}, the largest op error "
                f"{_maybe_percent(was.largest_error)}): the finding's cause is gone"
            )
        elif not _measurably_better(was, now):
            held = False
            notes.append(
                f"no error measurably smaller: the loss off FP32's by "
                f"{percent_text(was.loss_error)} before and {percent_text(now.loss_error)} "
                f"after, the largest op error {_maybe_percent(was.largest_error)} and "
                f"{_maybe_percent(now.largest_error)} (the finding went, the precision did not "
                "come back)"
            )
    return held, fails, notes


def _lost_before(was: PrecisionVerdict, rounding: float) -> bool:
    """Whether the precision check measured a loss: the loss off FP32's by more than one
    rounding of the format, or an op off by more than 16."""
    assert was.loss_error is not None
    return was.loss_error > rounding or (was.largest_error or 0.0) > 16 * rounding


def _measurably_better(was: PrecisionVerdict, now: PrecisionVerdict) -> bool:
    """Whether a precision fix brought something back: the loss's distance from FP32 or the
    largest op error at least halved."""
    assert was.loss_error is not None and now.loss_error is not None
    if now.loss_error <= was.loss_error / 2:
        return True
    return (
        was.largest_error is not None and now.largest_error is not None
        and now.largest_error <= was.largest_error / 2
    )


def _maybe_percent(value: float | None) -> str:
    return "unknown" if value is None else percent_text(value)


def fp32_loss_change(before: Report, after: Report) -> float | None:
    """The patched model's FP32 loss relative to the original model's FP32 loss: how much the
    patch changes what the model computes, rounding aside (0 for a region that only computes
    in FP32; a larger eps moves it). None when either is not known or not finite."""
    ref, got = before.reference_loss, after.reference_loss
    if ref is None or got is None or not (ref.finite and got.finite):
        return None
    if ref.max is None or got.max is None:
        return None
    return (got.max - ref.max) / max(abs(ref.max), 1e-3)


def loss_change(before: Report, after: Report) -> str | None:
    """Why the patched model does not compute what the original computes in FP32, or None.

    A fix keeps the model's FP32 semantics, so the re-scan's loss (in low precision, now
    finite) must be close to the original model's FP32 reference loss; a patch that makes the
    error go away by computing something else (zeros, a detached branch) is caught here."""
    ref, got = before.reference_loss, after.loss
    if ref is None or got is None or not ref.finite or ref.max is None:
        return None
    if not got.finite or got.max is None:
        return "the loss is not finite after the fix"
    scale = max(abs(ref.max), 1e-3)
    if abs(got.max - ref.max) > LOSS_RTOL * scale:
        return (
            f"the loss changed: {got.max:.6g} after the fix, {ref.max:.6g} in FP32 before it "
            "(the patch changes what the model computes)"
        )
    return None


def _original_place(
    location: SourceLocation | None, patched: dict[Path, PatchedFile]
) -> tuple[str, int, int, bool] | None:
    """``(file, first, last, edited)``: the original lines a re-scan location came from."""
    if location is None:
        return None
    file = _resolved(location.file)
    match = next((p for p in patched if _resolved(str(p)) == file), None)
    if match is None:
        return file, location.line, location.line, False
    origin = patched[match].line_map.origin(location.line)
    if origin is None:
        return file, location.line, location.line, False
    return file, *origin


def _same_site(
    old: Finding, new: Finding, place: tuple[str, int, int, bool] | None
) -> bool:
    if (old.op, old.module, old.phase) != (new.op, new.module, new.phase):
        return False
    if old.location is None or place is None:
        return old.location is None and place is None and old.code == new.code
    file, first, last, _ = place
    return _resolved(old.location.file) == file and first <= old.location.line <= last


def _resolved(file: str) -> str:
    try:
        return str(Path(file).resolve())
    except OSError:
        return file


def _describe(f: Finding) -> str:
    """``NH609 Tensor.mean at models.py:72``: the file named, a model's files may be several."""
    where = f" at {Path(f.location.file).name}:{f.location.line}" if f.location else ""
    return f"{f.code} {f.op or f.kind.value}{where}"


# --- the overlay -------------------------------------------------------------------------------


@contextmanager
def overlay(
    root: Path, patched: dict[Path, PatchedFile], entry: Path
) -> Iterator[tuple[Path, Callable[[str], str]]]:
    """A temporary mirror of ``root`` with the patched files written in; yields the entry
    file's path in it and a function mapping a path in the mirror back to the project."""
    root = root.resolve()
    files: dict[Path, bytes] = {}
    for path, p in patched.items():
        files[path.resolve()] = p.source.encode(p.new_text)
    entry = entry.resolve()
    if entry not in files:
        files[entry] = entry.read_bytes()
    for path in files:
        if not path.is_relative_to(root):
            raise NanHunterError(f"{path} is outside the project root {root}")
    folder = Path(tempfile.mkdtemp(prefix="nan-hunter-verify-"))
    shadow = folder / root.name
    try:
        _mirror(root, shadow, files)

        def back(file: str) -> str:
            try:
                return str(root / Path(file).relative_to(shadow))
            except ValueError:
                return file

        with _project_modules_set_aside(root, shadow):
            yield shadow / entry.relative_to(root), back
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _mirror(root: Path, shadow: Path, files: dict[Path, bytes]) -> None:
    real = {root}
    for path in files:
        real.update(p for p in path.parents if p.is_relative_to(root))
    for folder in sorted(real, key=lambda p: len(p.parts)):
        target = shadow / folder.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for child in folder.iterdir():
            if child in real or child in files:
                continue
            if child.is_symlink() and child.resolve() in files:  # a link to an edited file:
                (target / child.name).write_bytes(files[child.resolve()])  # own temp folder
                continue
            os.symlink(child, target / child.name, target_is_directory=child.is_dir())
    for path, data in files.items():
        (shadow / path.relative_to(root)).write_bytes(data)  # own temp folder


@contextmanager
def _project_modules_set_aside(root: Path, shadow: Path) -> Iterator[None]:
    """During the re-scan: the project's modules are not in ``sys.modules`` (so the overlay's
    are imported), and ``sys.path`` entries inside the project point into the mirror. After
    it, the modules imported from the mirror go and the project's come back; any other module
    the re-scan imported for the first time (a lazily imported part of torch) stays."""
    saved_path = list(sys.path)
    saved_bytecode = sys.dont_write_bytecode
    set_aside: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and _is_project_file(file, root):
            set_aside[name] = sys.modules.pop(name)
    sys.path[:] = [_into(entry, root, shadow) for entry in sys.path]
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if name in set_aside or (file and _under(file, shadow)):
                del sys.modules[name]
        sys.modules.update(set_aside)  # type: ignore[arg-type]
        sys.path[:] = saved_path
        sys.dont_write_bytecode = saved_bytecode


def _under(file: str, folder: Path) -> bool:
    return os.path.abspath(file).startswith(str(folder) + os.sep)


def _is_project_file(file: str, root: Path) -> bool:
    try:
        path = Path(real_path(file))
    except OSError:
        return False
    return (
        path.is_relative_to(root)
        and not path.is_relative_to(_OWN_PACKAGE)
        and not is_installed(str(path))
    )


def _into(entry: str, root: Path, shadow: Path) -> str:
    try:
        path = Path(entry or ".").resolve()
    except OSError:
        return entry
    if path.is_relative_to(root) and not is_installed(str(path)):
        return str(shadow / path.relative_to(root))
    return entry


def _mapped_back(report: Report, back: Callable[[str], str]) -> Report:
    def loc(location: SourceLocation | None) -> SourceLocation | None:
        return None if location is None else replace(location, file=back(location.file))

    findings = tuple(
        replace(f, location=loc(f.location), call_site=loc(f.call_site)) for f in report.findings
    )
    return replace(report, findings=findings)
