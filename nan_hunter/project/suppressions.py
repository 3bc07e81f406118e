"""Inline suppressions: a comment on a finding's line that the user has judged it (for an op
that ran inside an installed library: on its call site's line, in the user's project).

    scores = q @ k.transpose(-2, -1)  # nan-hunter: ignore[NH102] -- scores are masked to 1e4 first

The comment names one or more rule codes or prefixes (``ignore[NH102, NH5]``) and must give a
reason after ``--``. A suppressed finding stays in the report, marked with its reason, and does
not count toward the exit code. A suppression without a reason suppresses nothing: the finding
stays active and the report says why in a note on the target.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from nan_hunter.core.location import SourceLocation
from nan_hunter.findings import Finding, Report, Suppression
from nan_hunter.project.config import known_codes
from nan_hunter.project.paths import is_installed

SYNTAX = "# nan-hunter: ignore[CODE] -- reason"
_DIRECTIVE = re.compile(
    r"nan-hunter:\s*ignore\[\s*(?P<codes>[A-Za-z0-9_]+(?:\s*,\s*[A-Za-z0-9_]+)*)\s*\]"
    r"(?P<rest>.*)$"
)


@dataclass(frozen=True)
class Directive:
    """One ``# nan-hunter: ignore[...]`` comment."""

    line: int
    codes: tuple[str, ...]
    reason: str

    def covers(self, code: str) -> bool:
        return any(code.startswith(prefix) for prefix in self.codes)

    def unknown_codes(self) -> tuple[str, ...]:
        """The codes that are no rule code nor a prefix of one (``NH1O1``, a letter O)."""
        known = _known_codes()
        return tuple(c for c in self.codes if not any(k.startswith(c) for k in known))


@lru_cache(maxsize=1)
def _known_codes() -> frozenset[str]:
    return known_codes()


def parse_comment(comment: str, line: int) -> Directive | None:
    """The directive in one comment (``# ...`` text), or None when it holds none."""
    match = _DIRECTIVE.search(comment)
    if match is None:
        return None
    codes = tuple(code.strip().upper() for code in match.group("codes").split(","))
    reason = match.group("rest").strip()
    reason = reason.removeprefix("--").strip() if reason.startswith("--") else ""
    return Directive(line=line, codes=codes, reason=reason)


@lru_cache(maxsize=256)
def _directives(path: str, mtime_ns: int) -> dict[int, Directive]:
    try:
        source = Path(path).read_bytes()
    except OSError:
        return {}
    # Python reads \r\n and a lone \r as line ends, tokenize only \n: a file with old Mac
    # line ends would be one line to it, and its directives on no line the report names.
    source = source.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    found: dict[int, Directive] = {}
    try:
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            if token.type == tokenize.COMMENT:
                directive = parse_comment(token.string, token.start[0])
                if directive is not None:
                    found[directive.line] = directive
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        return {}
    return found


def directives_in(path: str) -> dict[int, Directive]:
    """The directives of a source file by line (cached per file modification time)."""
    try:
        mtime = Path(path).stat().st_mtime_ns
    except (OSError, ValueError):
        return {}
    return _directives(path, mtime)


def apply_suppressions(report: Report) -> Report:
    """``report`` with each finding whose line carries a matching directive marked suppressed;
    a matching directive without a reason is named in a note on the target instead, and so is
    a directive on its line that names an unknown code."""
    findings: list[Finding] = []
    notes: list[str] = []
    for f in report.findings:
        found = _directive_for(f)
        if found is None or f.suppression is not None:
            findings.append(f)
            continue
        directive, where = found
        if directive.unknown_codes():
            unknown = ", ".join(repr(c) for c in directive.unknown_codes())
            outcome = "" if directive.covers(f.code) else f", so {f.code} is not suppressed"
            notes.append(
                f"{where.render()}: ignore[{', '.join(directive.codes)}] names an unknown rule "
                f"code {unknown}{outcome} (codes and prefixes of `nan-hunter rules`)"
            )
        if not directive.covers(f.code):
            findings.append(f)
        elif directive.reason:
            suppression = Suppression(directive.reason, where.file, directive.line)
            findings.append(dataclasses.replace(f, suppression=suppression))
        else:
            findings.append(f)
            notes.append(
                f"{where.render()}: ignore[{', '.join(directive.codes)}] has no reason, so "
                f"{f.code} is not suppressed; write `{SYNTAX}`"
            )
    if findings == list(report.findings) and not notes:
        return report
    target = dataclasses.replace(report.target, notes=_unique((*report.target.notes, *notes)))
    return dataclasses.replace(report, target=target, findings=tuple(findings))


def _directive_for(f: Finding) -> tuple[Directive, SourceLocation] | None:
    """The directive on the finding's line, or on its call site's (the line in the user's
    project that called into the installed library where the op ran), and where it is: one
    that covers the finding first, else one that names an unknown code (for its note). Only
    the user's own files count: an installed library's comment judges no finding of theirs."""
    named = None
    for where in (f.location, f.call_site):
        if where is None or where.file.startswith("<") or is_installed(where.file):
            continue
        directive = directives_in(where.file).get(where.line)
        if directive is not None and directive.covers(f.code):
            return directive, where
        if directive is not None and named is None and directive.unknown_codes():
            named = directive, where
    return named


def _unique(notes: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(notes))
