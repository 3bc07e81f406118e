"""Fixes that are proven: verify each by re-scanning a patched copy; apply them to the file.

A fix is *verified* when its diff, applied to a temporary copy of the user's file, makes the
finding's origin disappear from a re-scan with the same options. The copy lives in a temporary
folder; the file's own folder is put on ``sys.path`` so that its sibling imports still work. The
user's file is only written by ``apply_fixes`` (``--fix``), through ``nan_hunter.safe_write``: the
original first goes to a new ``FILE.orig`` (``FILE.orig.1``... when taken) unless asked not to,
then a fsynced temporary file is renamed over the source.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from nan_hunter.errors import NanHunterError
from nan_hunter.findings import Applicability, Finding, Report
from nan_hunter.fixes.apply import PatchConflict, apply_diffs
from nan_hunter.loader import folder_on_path
from nan_hunter.safe_write import replace_with_backup, write_file

Rescan = Callable[[Path], Report]
"""Scans a model file with the options of the original scan."""


def _describe(f: Finding) -> str:
    where = f" at line {f.location.line}" if f.location else ""
    return f"{f.code} {f.op or f.kind.value}{where}"


def _same_origin(a: Finding, b: Finding) -> bool:
    return (a.code, a.op, a.module, a.phase) == (b.code, b.op, b.module, b.phase)


def scan_patched(original: Path, diffs: list[str], rescan: Rescan) -> Report:
    """Scan a temporary copy of ``original`` with ``diffs`` applied."""
    text = apply_diffs(original.read_text(encoding="utf-8"), diffs)
    with tempfile.TemporaryDirectory(prefix="nan-hunter-verify-") as folder:
        copy = Path(folder) / original.name
        copy.write_text(text, encoding="utf-8")
        with folder_on_path(original.parent):
            return rescan(copy)


def verify_fixes(report: Report, rescan: Rescan) -> Report:
    """The report with ``fix.verified`` and ``fix.remaining`` set for every fix with a diff."""
    findings = []
    for finding in report.findings:
        fix = finding.fix
        if fix is not None and fix.diff and fix.file:
            try:
                after = scan_patched(Path(fix.file), [fix.diff], rescan)
            except (NanHunterError, OSError, UnicodeError) as exc:
                fix = replace(fix, verified=False, remaining=(f"re-scan failed: {exc}",))
            else:
                errors = [g for g in after.findings if g.is_error]
                gone = not any(_same_origin(finding, g) for g in errors)
                fix = replace(fix, verified=gone, remaining=tuple(_describe(g) for g in errors))
            finding = replace(finding, fix=fix)
        findings.append(finding)
    return replace(report, findings=tuple(findings))


@dataclass(frozen=True)
class Applied:
    file: Path
    fixed: tuple[Finding, ...]
    skipped: tuple[tuple[Finding, str], ...]
    backup: Path | None


def _applicable(f: Finding, unsafe: bool) -> str | None:
    """None when ``f``'s fix may be applied, else why not."""
    fix = f.fix
    if fix is None or not fix.diff or not fix.file:
        return "no automatic fix"
    if fix.applicability is Applicability.UNSAFE and not unsafe:
        return "unsafe fix (use --unsafe-fixes)"
    if fix.applicability is Applicability.DISPLAY_ONLY:
        return "display-only advice"
    if fix.verified is False:
        return "the fix did not remove the finding in a re-scan"
    return None


def apply_fixes(
    report: Report,
    *,
    unsafe: bool = False,
    backup: bool = True,
    backed_up: set[Path] | None = None,
) -> list[Applied]:
    """Write every applicable fix of ``report`` into its file (one write per file).

    With ``backup``, each file is first copied to a new ``FILE.orig[.N]`` (see ``safe_write``),
    except the files in ``backed_up`` (already backed up earlier in the same run); the files
    backed up now are added to it."""
    by_file: dict[Path, list[Finding]] = {}
    skipped: dict[Path, list[tuple[Finding, str]]] = {}
    for f in report.active:  # a suppressed finding is the user's call: never fixed
        reason = _applicable(f, unsafe)
        if reason is not None and not f.is_error:
            continue  # warnings without an automatic fix are not worth a "not fixed" line
        path = Path(f.fix.file) if f.fix is not None and f.fix.file else Path(report.target.file)
        if reason is None:
            by_file.setdefault(path, []).append(f)
        else:
            skipped.setdefault(path, []).append((f, reason))
    results = []
    for path in sorted(set(by_file) | set(skipped)):
        chosen = by_file.get(path, [])
        saved = None
        if chosen:
            chosen, conflicts = _without_conflicts(path, chosen)
            skipped.setdefault(path, []).extend(conflicts)
            text = apply_diffs(path.read_text(encoding="utf-8"), [f.fix.diff for f in chosen])  # type: ignore[union-attr,misc]
            first = backed_up is None or path not in backed_up
            saved = _write(path, text, backup=backup and first)
            if saved is not None and backed_up is not None:
                backed_up.add(path)
        results.append(Applied(path, tuple(chosen), tuple(skipped.get(path, [])), saved))
    return results


def _without_conflicts(
    path: Path, findings: list[Finding]
) -> tuple[list[Finding], list[tuple[Finding, str]]]:
    """Keep the fixes that apply together, in report order; the rest wait for a next round."""
    original = path.read_text(encoding="utf-8")
    kept: list[Finding] = []
    dropped: list[tuple[Finding, str]] = []
    for f in findings:
        try:
            apply_diffs(original, [g.fix.diff for g in [*kept, f]])  # type: ignore[union-attr,misc]
        except PatchConflict as exc:
            dropped.append((f, f"overlaps another fix ({exc}); run again or use --fix-all"))
        else:
            kept.append(f)
    return kept, dropped


def _write(path: Path, text: str, *, backup: bool) -> Path | None:
    if backup:
        return replace_with_backup(path, text)
    write_file(path, text)
    return None


@dataclass(frozen=True)
class Round:
    number: int
    report: Report
    """The scan at the start of this round."""
    applied: tuple[Applied, ...]


def fix_all(
    path: Path,
    scan: Rescan,
    *,
    rounds: int = 5,
    unsafe: bool = False,
    backup: bool = True,
) -> tuple[list[Round], Report]:
    """Scan, verify, fix, and again, until no error remains, nothing more can be fixed, or
    ``rounds`` rounds have run. Returns the rounds and the final scan."""
    done: list[Round] = []
    report = verify_fixes(scan(path), scan)
    backed_up: set[Path] = set()  # one backup per file per run: the version before round 1
    for number in range(1, rounds + 1):
        if report.errors == 0:
            break
        applied = apply_fixes(report, unsafe=unsafe, backup=backup, backed_up=backed_up)
        done.append(Round(number, report, tuple(applied)))
        if not any(a.fixed for a in applied):
            break
        report = verify_fixes(scan(path), scan)
    return done, report
