"""The atomic writer: whole or nothing, backups never overwritten, mode and owner kept."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from nan_hunter.core import safe_write
from nan_hunter.core.safe_write import WriteError, make_backup, replace_with_backup, write_file


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_write_file_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_file(target, "one")
    write_file(target, b"two")
    assert _files(tmp_path) == {"report.json": b"two"}


def test_backups_are_numbered_never_overwritten(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_bytes(b"v1\r\n")
    assert replace_with_backup(source, "v2\n").name == "model.py.orig"
    assert replace_with_backup(source, "v3\n").name == "model.py.orig.1"
    (tmp_path / "model.py.orig.2").write_bytes(b"someone else's")
    assert replace_with_backup(source, "v4\n").name == "model.py.orig.3"
    assert _files(tmp_path) == {
        "model.py": b"v4\n",
        "model.py.orig": b"v1\r\n",
        "model.py.orig.1": b"v2\n",
        "model.py.orig.2": b"someone else's",
        "model.py.orig.3": b"v3\n",
    }


def test_a_truncated_stub_backup_is_not_trusted(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_bytes(b"the original\n")
    (tmp_path / "model.py.orig").write_bytes(b"the or")  # left by a full disk earlier
    backup = replace_with_backup(source, "fixed\n")
    assert backup.read_bytes() == b"the original\n"
    assert (tmp_path / "model.py.orig").read_bytes() == b"the or"


@pytest.mark.parametrize("failing_call", [1, 2])
def test_enospc_leaves_the_original_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    """The disk fills while the backup (call 1) or the new source (call 2) is flushed."""
    source = tmp_path / "model.py"
    source.write_bytes(b"original\n")
    calls = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return real_fsync(fd)  # the folder's fsync
        calls.append(fd)
        if len(calls) == failing_call:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(safe_write.os, "fsync", fsync)
    with pytest.raises(WriteError, match="no space left on the device"):
        replace_with_backup(source, "fixed\n")
    assert _files(tmp_path) == {"model.py": b"original\n"}


def test_mode_and_owner_are_kept(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text("x = 1\n")
    source.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(source, 4321, 4321)
    backup = replace_with_backup(source, "x = 2\n")
    for path in (source, backup):
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o640
        if os.geteuid() == 0:
            assert (info.st_uid, info.st_gid) == (4321, 4321)


def test_read_only_file_and_folder_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text("x = 1\n")
    source.chmod(0o444)
    with pytest.raises(WriteError, match="the file is read-only"):
        replace_with_backup(source, "x = 2\n")
    source.chmod(0o644)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(WriteError, match="is read-only"):
            replace_with_backup(source, "x = 2\n")
        with pytest.raises(WriteError, match="is read-only"):
            write_file(tmp_path / "new.txt", "x")
    finally:
        tmp_path.chmod(0o755)
    assert _files(tmp_path) == {"model.py": b"x = 1\n"}


def test_backup_of_a_missing_file_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="cannot read"):
        make_backup(tmp_path / "nope.py")


def test_a_folder_is_not_a_report_file(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="not a regular file"):
        write_file(tmp_path, "x")


def test_every_file_the_package_writes_goes_through_the_atomic_writer() -> None:
    """A plain ``write_text``/``write_bytes``/``open(..., "w")`` anywhere in nan_hunter outside
    safe_write.py could truncate a user's file on a full disk: none may creep back in. A write
    into a folder nan-hunter made itself says so with an ``# own temp folder`` comment."""
    import ast

    import nan_hunter

    package = Path(nan_hunter.__file__).parent
    offenders = []
    for source in sorted(package.rglob("*.py")):
        if source.name == "safe_write.py":
            continue
        text = source.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            mode = node.args[1] if name == "open" and len(node.args) > 1 else None
            for kw in node.keywords:
                if name == "open" and kw.arg == "mode":
                    mode = kw.value
            writes_mode = isinstance(mode, ast.Constant) and any(
                c in str(mode.value) for c in "wax+"
            )
            if "# own temp folder" in lines[node.lineno - 1]:
                continue
            if name in {"write_text", "write_bytes"} or writes_mode:
                offenders.append(f"{source.relative_to(package)}:{node.lineno}")
    assert offenders == []
