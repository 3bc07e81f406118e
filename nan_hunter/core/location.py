"""A place in the user's source: the one value type the tracer, the findings and the fixes share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int
    code: str

    def render(self) -> str:
        return f"{self.file}:{self.line}"
