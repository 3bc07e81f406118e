"""Paths as reports show them: relative to the working directory when below it."""

from __future__ import annotations

import os
from pathlib import Path


def display_path(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.replace(os.sep, "/")
