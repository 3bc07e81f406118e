"""A user's source file as it is on disk: bytes, declared encoding, BOM, line endings.

Fixes are planned and applied on the decoded text and written back in the file's own encoding,
so a CRLF file stays CRLF, a BOM stays, a Latin-1 file with a PEP 263 coding cookie stays
Latin-1, and a file without a final newline gets none.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from dataclasses import dataclass
from pathlib import Path

from nan_hunter.errors import NanHunterError

_BOM = "\ufeff"
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


class SourceError(NanHunterError):
    """A source file cannot be read or decoded as Python source."""


@dataclass(frozen=True)
class Source:
    path: Path
    text: str
    """The decoded text, without a BOM."""
    encoding: str
    """The codec of the file (``utf-8`` for a UTF-8 file with a BOM: the BOM is kept apart)."""
    bom: bool

    def encode(self, text: str) -> bytes:
        """``text`` (a new version of this file) as the bytes to write."""
        return (_BOM if self.bom else "").encode(self.encoding) + text.encode(self.encoding)

    @property
    def lines(self) -> list[str]:
        return split_lines(self.text)


def read_source(path: Path) -> Source:
    """Read ``path`` per PEP 263 (BOM, coding cookie, default UTF-8); line endings are kept."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return decode_source(path, raw)


def decode_source(path: Path, raw: bytes) -> Source:
    """Decode the bytes ``raw`` of ``path`` per PEP 263; ``SourceError`` when they are not
    Python source in their declared encoding."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        bom = encoding == "utf-8-sig"
        codec = "utf-8" if bom else encoding
        text = raw.decode(codec)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot decode {path}: {exc}") from exc
    if bom:
        text = text.removeprefix(_BOM)
    return Source(path=path, text=text, encoding=codec, bom=bom)


def parse_source(path: Path) -> tuple[Source, ast.Module] | None:
    """``path`` read (``read_source``) and parsed; None when it cannot be read, decoded or
    parsed (a fix then offers no edit for it)."""
    try:
        source = read_source(path)
        return source, ast.parse(source.text)
    except (SourceError, SyntaxError, ValueError):
        return None


def split_lines(text: str) -> list[str]:
    """Split on ``\\r\\n``, ``\\r`` and ``\\n`` only (as Python does), keeping the endings."""
    return _LINE.findall(text)


class SourcePositions:
    """Source text split into lines, mapping ast positions (UTF-8 byte columns) to character
    offsets into the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = split_lines(text)
        self._starts: list[int] = []
        offset = 0
        for line in self.lines:
            self._starts.append(offset)
            offset += len(line)
        self._starts.append(offset)

    def line(self, lineno: int) -> str:
        """The text of 1-based line ``lineno`` without its line ending."""
        return self.lines[lineno - 1].rstrip("\r\n")

    def char_col(self, lineno: int, byte_col: int) -> int:
        """Convert an ast column (UTF-8 bytes) on ``lineno`` to a character column."""
        return len(self.line(lineno).encode("utf-8")[:byte_col].decode("utf-8"))

    def offset(self, lineno: int, byte_col: int) -> int:
        """Character offset into the whole text of an ast position."""
        return self._starts[lineno - 1] + self.char_col(lineno, byte_col)

    def span(self, node: ast.expr | ast.stmt) -> tuple[int, int]:
        """Character offsets ``(start, end)`` of a node."""
        assert node.end_lineno is not None and node.end_col_offset is not None
        return (
            self.offset(node.lineno, node.col_offset),
            self.offset(node.end_lineno, node.end_col_offset),
        )

    def segment(self, node: ast.expr) -> str:
        start, end = self.span(node)
        return self.text[start:end]


def compiles(text: str, filename: str = "<patched>") -> bool:
    """Whether ``text`` compiles as a module (warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(text, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
    return True


def dotted_name(expr: ast.expr) -> str | None:
    """``bsz``, ``self.scale``: a name or an attribute of a name; None for anything else."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    return None


def last_name(func: ast.expr) -> str | None:
    """The name a call is made by: ``f`` of ``f(x)``, ``mean`` of ``x.mean()``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None
