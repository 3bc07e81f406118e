"""Paths as reports show them: relative to the working directory when below it; SARIF's relative
to the repository root."""

from __future__ import annotations

import os
from pathlib import Path


def repository_root(start: Path | None = None) -> Path:
    """The nearest folder at or above ``start`` (the working directory) holding ``.git``; the
    working directory itself when there is none."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def repository_relative(path: str) -> str | None:
    """``path`` relative to ``repository_root()`` in POSIX form, or None when it is outside."""
    try:
        return Path(path).resolve().relative_to(repository_root()).as_posix()
    except ValueError:
        return None


def display_path(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.replace(os.sep, "/")
