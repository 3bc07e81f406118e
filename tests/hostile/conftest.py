"""The hostile-input catalog's fixture: a working folder whose every file is snapshotted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` (relative path -> bytes and permission bits); a link is
    recorded as its target, not followed."""
    found: dict[str, tuple[bytes, int]] = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = (os.readlink(path).encode(), 0)
            else:
                found[rel] = (path.read_bytes(), stat.S_IMODE(info.st_mode))
    return found


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder, the current directory for the test; writable again after it."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    yield folder
    for root, dirs, _ in os.walk(tmp_path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(tmp_path, 0o755)
