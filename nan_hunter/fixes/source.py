"""A user's source file as it is on disk: bytes, declared encoding, BOM, line endings.

Fixes are planned and applied on the decoded text and written back in the file's own encoding,
so a CRLF file stays CRLF, a BOM stays, a Latin-1 file with a PEP 263 coding cookie stays
Latin-1, and a file without a final newline gets none.
"""

from __future__ import annotations

import io
import re
import tokenize
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


def split_lines(text: str) -> list[str]:
    """Split on ``\\r\\n``, ``\\r`` and ``\\n`` only (as Python does), keeping the endings."""
    return _LINE.findall(text)
