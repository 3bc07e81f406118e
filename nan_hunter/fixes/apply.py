"""Apply unified diffs (as nan-hunter writes them) to a file's text, several at once.

Each fix's diff is computed against the original file. Hunks of different fixes are applied
together, bottom-up, when they do not overlap; identical hunks (two fixes adding the same
``import torch``) are applied once. Context lines must match exactly.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from nan_hunter.errors import NanHunterError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchConflict(NanHunterError):
    """Two fixes change the same lines, or a diff does not fit the file."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    """1-based first line of the hunk in the original (for an empty old side: the line after
    which the new lines go)."""
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]

    @property
    def old_end(self) -> int:
        return self.old_start + len(self.old_lines)


def parse_hunks(diff: str) -> list[Hunk]:
    hunks: list[Hunk] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        match = _HUNK.match(lines[i])
        i += 1
        if not match:
            continue
        old: list[str] = []
        new: list[str] = []
        last = ""
        while i < len(lines) and not lines[i].startswith(("@@", "--- ", "+++ ")):
            line = lines[i]
            i += 1
            tag, text = line[:1], line[1:]
            if tag == "\\":  # "\ No newline at end of file": the previous line has none
                for side, tags in ((old, " -"), (new, " +")):
                    if side and last in tags:
                        side[-1] = side[-1].rstrip("\r\n")
                continue
            last = tag
            if tag == " ":
                old.append(text)
                new.append(text)
            elif tag == "-":
                old.append(text)
            elif tag == "+":
                new.append(text)
        start = int(match.group(1))
        if not old:
            start += 1  # "-N,0": insert after line N
        hunks.append(Hunk(start, tuple(old), tuple(new)))
    return hunks


def apply_diffs(original: str, diffs: list[str]) -> str:
    """``original`` with every hunk of ``diffs`` applied; raises ``PatchConflict``."""
    lines = original.splitlines(keepends=True)
    hunks = sorted(set(h for d in diffs for h in parse_hunks(d)), key=lambda h: h.old_start)
    for earlier, later in itertools.pairwise(hunks):
        if later.old_start < earlier.old_end or (
            later.old_start == earlier.old_start and earlier != later
        ):
            raise PatchConflict(
                f"two fixes change overlapping lines ({earlier.old_start}-{earlier.old_end - 1} "
                f"and {later.old_start}-{later.old_end - 1})"
            )
    for hunk in reversed(hunks):
        at = hunk.old_start - 1
        if tuple(lines[at : at + len(hunk.old_lines)]) != hunk.old_lines:
            raise PatchConflict(f"a fix does not fit the file at line {hunk.old_start}")
        lines[at : at + len(hunk.old_lines)] = list(hunk.new_lines)
    return "".join(lines)
