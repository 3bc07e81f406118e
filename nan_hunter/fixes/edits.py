"""Edits on source files: derive them, combine them, apply them, map lines, render diffs.

Every output of a fix (the report's diff, ``--diff``, ``--patch``, SARIF ``fixes``, ``--fix``)
is made here from the same ``Edit`` records; nothing parses a diff back.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nan_hunter.core.untrusted import diff_path
from nan_hunter.errors import NanHunterError
from nan_hunter.findings import Edit
from nan_hunter.fixes.source_file import Source, read_source, split_lines


class EditConflict(NanHunterError):
    """Two edits change the same text, or an edit does not fit the file any more."""


def text_digest(text: str) -> str:
    """A digest of a file's decoded text: what an edit was planned on."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def edits_between(file: Path, old: str, new: str) -> tuple[Edit, ...]:
    """Whole-line edits that turn ``old`` into ``new`` (both decoded, BOM excluded); each
    records the digest of ``old``, so it is never applied to a file that changed since."""
    old_lines, new_lines = split_lines(old), split_lines(new)
    starts = list(itertools.accumulate((len(line) for line in old_lines), initial=0))
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    planned_on = text_digest(old)
    return tuple(
        Edit(str(file), starts[i1], starts[i2], "".join(new_lines[j1:j2]), planned_on)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    )


def combine(edits: Iterable[Edit]) -> list[Edit]:
    """The edits of one file in order, identical ones once; raises ``EditConflict`` when two
    different edits overlap (or insert at the same place)."""
    ordered = sorted(set(edits), key=lambda e: (e.start, e.end, e.replacement))
    for a, b in itertools.pairwise(ordered):
        if b.start < a.end or (b.start == a.start and (a.start == a.end or b.start == b.end)):
            raise EditConflict(f"two fixes change the same text (at offset {b.start})")
    return ordered


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """``text`` with ``edits`` (of one file) applied."""
    ordered = combine(edits)
    if ordered and ordered[-1].end > len(text):
        raise EditConflict("a fix does not fit the file (it changed since the scan)")
    for edit in reversed(ordered):
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    return text


def by_file(edits: Iterable[Edit]) -> dict[Path, list[Edit]]:
    grouped: dict[Path, list[Edit]] = {}
    for edit in edits:
        grouped.setdefault(Path(edit.file), []).append(edit)
    return grouped


@dataclass(frozen=True)
class PatchedFile:
    source: Source
    new_text: str
    line_map: LineMap


def patch_files(edits: Iterable[Edit]) -> dict[Path, PatchedFile]:
    """Every edited file, read from disk, with the edits applied."""
    out: dict[Path, PatchedFile] = {}
    for path, file_edits in by_file(edits).items():
        source = read_source(path)
        planned = {e.planned_on for e in file_edits if e.planned_on}
        if planned and planned != {text_digest(source.text)}:
            raise EditConflict(f"{path} changed since the scan; no fix was written: scan it again")
        new_text = apply_edits(source.text, file_edits)
        out[path] = PatchedFile(source, new_text, LineMap.of(source.text, file_edits))
    return out


@dataclass(frozen=True)
class LineMap:
    """Where each line of the patched file came from: an unchanged original line, or one of
    the edited ranges of original lines."""

    blocks: tuple[tuple[int, int, int, int, bool], ...]
    """``(new_first, new_last, old_first, old_last, edited)``, 1-based and inclusive."""

    @classmethod
    def of(cls, old: str, edits: Iterable[Edit]) -> LineMap:
        ordered = combine(edits)
        starts = list(itertools.accumulate((len(x) for x in split_lines(old)), initial=0))
        n_old = len(starts) - 1

        def line_at(offset: int) -> int:  # 0-based line index starting at offset
            return starts.index(offset) if offset in starts else n_old

        blocks: list[tuple[int, int, int, int, bool]] = []
        old_at, new_at = 0, 0  # 0-based next line
        for edit in ordered:
            first, last = line_at(edit.start), line_at(edit.end)
            if first > old_at:
                n = first - old_at
                blocks.append((new_at + 1, new_at + n, old_at + 1, old_at + n, False))
                new_at += n
            added = len(split_lines(edit.replacement))
            blocks.append((new_at + 1, new_at + added, first + 1, max(last, first + 1), True))
            new_at += added
            old_at = last
        if n_old > old_at:
            n = n_old - old_at
            blocks.append((new_at + 1, new_at + n, old_at + 1, old_at + n, False))
        return cls(tuple(blocks))

    def origin(self, new_line: int) -> tuple[int, int, bool] | None:
        """``(old_first, old_last, edited)`` for a line of the patched file."""
        for new_first, new_last, old_first, old_last, edited in self.blocks:
            if new_first <= new_line <= new_last:
                if edited:
                    return old_first, old_last, True
                old = old_first + new_line - new_first
                return old, old, False
        return None

    def edited_ranges(self) -> list[tuple[int, int]]:
        return [(b[2], b[3]) for b in self.blocks if b[4]]


def relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def render_diff(edits: Iterable[Edit], root: Path) -> str:
    """The edits as one unified diff, ``a/``/``b/`` paths relative to ``root``."""
    return "".join(text for text, _ in _sections(edits, root))


def render_patch(edits: Iterable[Edit], root: Path) -> bytes:
    """``render_diff`` as bytes: each file's section in that file's own encoding, so that
    ``git apply`` matches the context lines of a Latin-1 file."""
    return b"".join(text.encode(source.encoding) for text, source in _sections(edits, root))


def _sections(edits: Iterable[Edit], root: Path) -> list[tuple[str, Source]]:
    sections = []
    for path, patched in sorted(patch_files(edits).items()):
        rel = relative(path, root)
        old_lines = split_lines(patched.source.text)
        new_lines = split_lines(patched.new_text)
        if patched.source.bom and old_lines:  # the BOM is part of the first line on disk
            old_lines[0] = "\ufeff" + old_lines[0]
            if new_lines:
                new_lines[0] = "\ufeff" + new_lines[0]
        out: list[str] = []
        names = diff_path(f"a/{rel}"), diff_path(f"b/{rel}")
        for line in difflib.unified_diff(old_lines, new_lines, *names):
            if line.endswith(("\n", "\r")):
                out.append(line)
            else:
                out.append(line + "\n\\ No newline at end of file\n")
        sections.append(("".join(out), patched.source))
    return sections
