"""Model-file check before a scan process starts: a path the
system cannot even look at (a name longer than the file system allows; a folder the user may not
enter, which a root test cannot make) is a file that cannot be read, in one line, exit 2; and
with several files, the others still scan. Before, (as before, in the folder expansion
before) the ``OSError`` of ``Path.is_dir``/``is_file`` ended the whole run as an internal error;
so did the loader's ``Path.exists`` for a name without ``.py`` (a module name or a folder)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import FIXTURES

_TOO_LONG = "m" * 300 + ".py"
_WHY = os.strerror(errno.ENAMETOOLONG)


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def test_a_name_too_long_is_a_file_that_cannot_be_read(work: Path) -> None:
    code, out, err = _invoke("scan", _TOO_LONG)
    assert (code, out) == (2, "")
    assert err == f"nan-hunter: error: cannot read model file {_TOO_LONG}: {_WHY}\n"


def test_a_name_too_long_among_several_files_fails_alone(work: Path) -> None:
    shutil.copy(FIXTURES / "fx_clean.py", work / "clean.py")
    code, out, err = _invoke("scan", "clean.py", _TOO_LONG, "--format", "json", "-q")
    assert code == 2
    data = json.loads(out)
    assert [r["target"]["file"] for r in data["reports"]] == ["clean.py"]
    message = f"cannot read model file {_TOO_LONG}: {_WHY}"
    assert data["failed"] == [{"path": _TOO_LONG, "message": message}]
    assert err == f"nan-hunter: error: {_TOO_LONG}: {message}\n"


def test_a_name_too_long_without_py_is_a_path_that_cannot_be_read(work: Path) -> None:
    name = _TOO_LONG.removesuffix(".py")
    code, out, err = _invoke("scan", name)
    assert (code, out) == (2, "")
    assert err == f"nan-hunter: error: cannot read {name}: {_WHY}\n"


def test_the_python_api_says_the_same(work: Path) -> None:
    """``scan_file`` loads in the caller's process: the loader asks the same check as the CLI
    (``targets.check_model_file``; before, its ``Path.is_dir`` raised ``OSError``)."""
    import pytest

    from nan_hunter import scan_file
    from nan_hunter.errors import LoadError

    with pytest.raises(LoadError, match=re.escape(f"cannot read model file {_TOO_LONG}: {_WHY}")):
        scan_file(_TOO_LONG)
    with pytest.raises(LoadError, match=r"^model file not found: absent\.py$"):
        scan_file("absent.py")
