"""Text that comes from the model (file and module names, source lines, exception messages) made
safe to show: on a terminal, in a CI log, in a one-line error.

A model's text can hold terminal control sequences (``ESC]52`` clipboard writes, ``ESC]8`` links,
cursor moves, ``ESC]0`` window titles), carriage returns that overwrite a line, newlines that forge
lines of their own (a GitHub workflow command, a fake ``clean:`` summary), bidirectional overrides
that reorder what a reader sees (Trojan Source), and lone surrogates that no terminal encoding can
write. ``shown`` writes each such character as a visible escape (``\\x1b``, ``\\n``, ``\\u202e``),
so nothing from the model acts on the reader's terminal and the text still says what it was.
Our own styling (rich's colour codes) is added after this, never passed through it.
"""

from __future__ import annotations

import re

ECHO_LIMIT = 2000
"""The most characters of a model's text one line of ours echoes (``capped``)."""

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Bidirectional marks and overrides: they reorder what a reader sees."""
_OTHERS = "\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "\ud800-\udfff"
"""C0 controls but tab and newline, DEL, C1 (``\\x9b`` is a one-byte CSI on some terminals),
bidi controls and lone surrogates."""
_UNSAFE = re.compile(f"[\n{_OTHERS}]")
_UNSAFE_KEEPING_NEWLINES = re.compile(f"[{_OTHERS}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` as one line with every control, bidi and surrogate character escaped."""
    return _UNSAFE.sub(_escaped, text)


def shown_lines(text: str) -> str:
    """Like ``shown``, but newlines stay: for text that is many lines by nature (a diff)."""
    return _UNSAFE_KEEPING_NEWLINES.sub(_escaped, text)


def capped(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` up to ``limit`` characters, then ``... (N more)``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more)"


def echoed(text: str, limit: int = ECHO_LIMIT) -> str:
    """A model's text in one line of ours: capped, then ``shown``."""
    return shown(capped(text, limit))


_QUOTED_BY_GIT = re.compile(f'[\t\n"\\\\{_OTHERS}]')
"""What makes git quote a path in a diff header: a control character (tab and newline too), a
double quote or a backslash; here also the bidi controls and lone surrogates ``shown`` escapes."""
_C_ESCAPES = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
              "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}  # fmt: skip


def diff_path(path: str) -> str:
    """``path`` as a unified diff's ``---``/``+++`` header names it: as it is, or, when it holds
    a character that could end the header's line or hide in it, C-quoted as ``git diff`` quotes
    it (``"a/m\\n::x.py"``; a non-ASCII character as the octal escapes of its UTF-8 bytes), which
    ``git apply`` and GNU ``patch`` read back to the same file name."""
    if not _QUOTED_BY_GIT.search(path):
        return path
    out = []
    for char in path:
        if char in _C_ESCAPES:
            out.append(_C_ESCAPES[char])
        elif char < " " or char >= "\x7f":
            try:
                raw = char.encode("utf-8", "surrogateescape")  # a byte a file name held
            except UnicodeEncodeError:
                raw = char.encode("utf-8", "surrogatepass")
            out.extend(f"\\{byte:03o}" for byte in raw)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
