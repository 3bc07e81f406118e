"""``--fix`` with fixes in two files (verified together, as independent fixes of one
re-scan) when the second file cannot be written (read-only). README: "A read-only file or
folder is refused with one line; nothing is changed." Before, the first file was already
rewritten (and backed up) when the second was refused: exit 2, and the project half-fixed, in
a state no re-scan had verified. Now every file is checked before any is written, and a write
that fails after others (a full disk) puts those back."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.core import safe_write
from tests.hostile.sources import GRAM_LAYERS

LAYERS = GRAM_LAYERS

MODEL = """\
import torch
from torch import nn

from layers import Gram


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x) * 300.0
        b = (h * h).mean(-1)
        return b / (b.abs().amax() + 1.0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gram = Gram()
        self.head = Head()

    def forward(self, x):
        return self.gram(x) + self.head(x)


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(2, 8, 16)
"""


def _project(work: Path) -> tuple[Path, Path]:
    (work / "layers.py").write_text(LAYERS)
    (work / "model.py").write_text(MODEL)
    return work / "layers.py", work / "model.py"


def test_a_read_only_second_file_leaves_the_first_unchanged(work: Path) -> None:
    layers, model = _project(work)
    os.chmod(model, 0o444)
    result = CliRunner().invoke(app, ["scan", "model.py", "--fix", "-q"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"nan-hunter: error: cannot fix {model}: the file is read-only"
    )
    assert (layers.read_text(), model.read_text()) == (LAYERS, MODEL)
    assert sorted(p.name for p in work.iterdir()) == ["layers.py", "model.py"]


def test_a_failed_write_puts_back_the_files_written_before(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up while the second file is written (in the test's process)."""
    layers, model = _project(work)
    monkeypatch.setenv("NAN_HUNTER_IN_PROCESS", "1")
    write = safe_write.write_file

    def full_disk_for_the_model(path: Path, data: str | bytes, **kw: str) -> None:
        if Path(path).name == "model.py" and (
            data if isinstance(data, bytes) else data.encode()
        ) != MODEL.encode():  # the fixed model, not a restore of the original
            raise safe_write.WriteError(f"cannot write {path}: {os.strerror(errno.ENOSPC)}")
        write(path, data, **kw)

    monkeypatch.setattr(safe_write, "write_file", full_disk_for_the_model)
    result = CliRunner().invoke(app, ["scan", "model.py", "--fix", "-q"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"nan-hunter: error: cannot write {model}: {os.strerror(errno.ENOSPC)}"
    )
    assert (layers.read_text(), model.read_text()) == (LAYERS, MODEL)
    assert sorted(p.name for p in work.iterdir()) == ["layers.py", "model.py"]
