"""``project.real_path``: ``os.path.realpath`` with the folders' resolution cached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nan_hunter.project.paths import real_path


def test_real_path_equals_realpath_through_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real" / "pkg"
    real.mkdir(parents=True)
    (real / "mod.py").write_text("")
    (tmp_path / "linked").symlink_to(tmp_path / "real")  # a linked folder
    (real / "alias.py").symlink_to(real / "mod.py")  # a linked file
    (tmp_path / "real" / "top.py").write_text("")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "top.py").write_text("")  # where a lexical ".." would lead instead
    (tmp_path / "proj" / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    cases = [
        str(real / "mod.py"),
        str(tmp_path / "linked" / "pkg" / "mod.py"),
        str(tmp_path / "linked" / "pkg" / "alias.py"),
        "linked/pkg/mod.py",  # relative to the working directory
        str(tmp_path / "linked" / "pkg" / ".." / "pkg" / "mod.py"),
        str(tmp_path / "linked" / "missing.py"),
        str(tmp_path / "proj" / "link" / ".." / "top.py"),  # sys.path.insert(0, here + "/..")
        "proj/link/../top.py",
        "./linked/pkg/./mod.py",
    ]
    for case in cases:
        assert real_path(case) == os.path.realpath(case), case
    assert real_path(cases[2]) == str(real / "mod.py")
    assert real_path(cases[6]) == str(tmp_path / "real" / "top.py")
