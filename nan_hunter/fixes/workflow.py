"""Writing fixes: ``--fix`` (one selection, one write per file) and ``--fix-all`` (rounds).

Fixes are chosen by ``select_fixes`` (the same choice ``--diff`` and ``--patch`` show), applied
as edits to each file's decoded text and written back in the file's own encoding, BOM and line
endings through ``nan_hunter.core.safe_write``: the original first goes to a new ``FILE.orig``
(``FILE.orig.1``... when taken) unless asked not to, then a fsynced temporary file is renamed
over the source. Verification happens before, in the scan (``nan_hunter.fixes.verify``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from nan_hunter.core.safe_write import check_fixable, replace_with_backup, write_file
from nan_hunter.findings import Finding, Fix, Phase, Report
from nan_hunter.fixes.edits import patch_files
from nan_hunter.fixes.select import select_fixes
from nan_hunter.project.loader import forget_stale_modules
from nan_hunter.project.paths import shared_root

Scan = Callable[[Path], Report]
"""Scans (and verifies) the model file with the options of the original scan."""


@dataclass(frozen=True)
class Applied:
    file: Path
    fixed: tuple[Finding, ...]
    skipped: tuple[tuple[Finding, str], ...]
    backup: Path | None
    passed_over: tuple[tuple[Finding, Fix], ...] = ()
    """Verified unsafe fixes ranked first for a finding fixed here by a safe one: the cheaper
    change ``--unsafe-fixes`` would have taken (``Selection.passed_over``)."""


def apply_fixes(
    report: Report,
    *,
    unsafe: bool = False,
    backup: bool = True,
    backed_up: set[Path] | None = None,
) -> list[Applied]:
    """Write the selected fixes of ``report`` into their files (one write per file).

    With ``backup``, each file is first copied to a new ``FILE.orig[.N]`` (see ``safe_write``),
    except the files in ``backed_up`` (already backed up earlier in the same run); the files
    backed up now are added to it."""
    selection = select_fixes(report, unsafe=unsafe)
    fixed: dict[Path, list[Finding]] = {}
    for finding, fix in selection.chosen:
        for file in fix.files:
            fixed.setdefault(Path(file), []).append(finding)
    skipped: dict[Path, list[tuple[Finding, str]]] = {}
    for finding, why in selection.skipped:
        if not finding.is_error and finding.fix is not None and not finding.fix.edits:
            continue  # warnings with advice only are not worth a "not fixed" line
        file = finding.fix.file if finding.fix is not None and finding.fix.file else None
        skipped.setdefault(Path(file or report.target.file), []).append((finding, why))
    written: dict[Path, Path | None] = {}
    patched_files = patch_files(selection.edits)
    for path in patched_files:  # fixes verified together are written together, or none
        check_fixable(path)
    try:
        for path, patched in patched_files.items():
            first = backed_up is None or path not in backed_up
            written[path] = _write(
                path, patched.source.encode(patched.new_text), backup=backup and first
            )
    except BaseException:
        for path, saved in written.items():  # put back the files written before the failure
            patched = patched_files[path]
            write_file(path, patched.source.encode(patched.source.text))
            if saved is not None:
                saved.unlink(missing_ok=True)
        raise
    if backed_up is not None:
        backed_up.update(path for path, saved in written.items() if saved is not None)
    if written:  # a later scan in this process imports the project as written now
        forget_stale_modules(shared_root(list(written)))
    passed: dict[Path, list[tuple[Finding, Fix]]] = {}
    for finding, fix in selection.passed_over:
        passed.setdefault(Path(fix.file or report.target.file), []).append((finding, fix))
    results = []
    for path in sorted(set(fixed) | set(skipped)):
        results.append(
            Applied(path, tuple(dict.fromkeys(fixed.get(path, []))),
                    tuple(skipped.get(path, [])), written.get(path),
                    tuple(passed.get(path, [])))
        )
    return results


def _write(path: Path, data: bytes, *, backup: bool) -> Path | None:
    if backup:
        return replace_with_backup(path, data)
    write_file(path, data)
    return None


@dataclass(frozen=True)
class Round:
    number: int
    report: Report
    """The scan at the start of this round."""
    applied: tuple[Applied, ...]


@dataclass(frozen=True)
class FixAllResult:
    rounds: tuple[Round, ...]
    report: Report
    """The final scan."""
    stopped: str
    """Why the rounds ended: ``clean``, or what kept them from going on."""


def first_causes(report: Report, *, unsafe: bool = False) -> Report:
    """``report`` without its backward errors when a forward error gets a fix: one cause, one
    fix. A backward origin downstream of a forward overflow is often that overflow's
    consequence (its gradients meet the inf the forward made); fixed in the same round, it
    gets a fix of its own it does not need (under ``model.half()``, the whole model kept in
    FP32). ``--fix-all`` fixes the forward first and re-scans: what is left is then a cause
    of its own."""
    fixed = select_fixes(report, unsafe=unsafe).chosen
    if not any(f.is_error and f.phase is Phase.FORWARD for f, _ in fixed):
        return report
    kept = tuple(f for f in report.findings if not (f.is_error and f.phase is Phase.BACKWARD))
    return replace(report, findings=kept)


def fix_all(
    path: Path,
    scan: Scan,
    *,
    rounds: int = 5,
    unsafe: bool = False,
    backup: bool = True,
) -> FixAllResult:
    """Scan, fix, and again, until no error remains, nothing more can be fixed, a round
    changes nothing, or ``rounds`` rounds have run. A round fixes the forward errors before
    the backward ones (``first_causes``)."""
    done: list[Round] = []
    report = scan(path)
    seen_edits: set[object] = set()
    backed_up: set[Path] = set()  # one backup per file per run: the version before round 1
    stopped = "clean"
    for number in range(1, rounds + 2):
        if report.errors == 0:
            stopped = "clean"
            break
        if number > rounds:
            stopped = f"{rounds} round(s) ran and errors remain"
            break
        causes = first_causes(report, unsafe=unsafe)
        selection = select_fixes(causes, unsafe=unsafe)
        edits = frozenset(selection.edits)
        if not edits:
            reasons = "; ".join(f"{f.code}: {why}" for f, why in selection.skipped) or "none"
            stopped = f"no fix left to apply ({reasons})"
            done.append(Round(number, report, tuple(apply_fixes(
                causes, unsafe=unsafe, backup=backup, backed_up=backed_up))))
            break
        if edits in seen_edits:
            stopped = "a round would repeat an earlier round's edits"
            break
        seen_edits.add(edits)
        applied = apply_fixes(causes, unsafe=unsafe, backup=backup, backed_up=backed_up)
        done.append(Round(number, report, tuple(applied)))
        report = scan(path)
    return FixAllResult(tuple(done), report, stopped)
