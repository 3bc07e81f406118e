"""Source files as users have them: CRLF, a BOM, Latin-1 with a coding cookie, tabs, no final
newline. The patch applies with git from the project root, --fix writes the same bytes, the
file keeps its encoding and line endings, and the re-scan is clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app

runner = CliRunner()

MODEL = """\
{cookie}\"\"\"A model whose matmul overflows FP16 ({note}).\"\"\"

import torch
from torch import nn


class Gram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) * 300.0  # {note}
        g = h @ h.transpose(-2, -1)
        return g.mean(-1) / (g.abs().amax() + 1.0)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Gram()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 8, 16)
"""


def _shape(name: str) -> bytes:
    if name == "crlf":
        return MODEL.format(cookie="", note="CRLF").replace("\n", "\r\n").encode()
    if name == "bom":
        return b"\xef\xbb\xbf" + MODEL.format(cookie="", note="BOM, caf\u00e9").encode()
    if name == "latin1":
        text = MODEL.format(cookie="# -*- coding: latin-1 -*-\n", note="Latin-1, caf\u00e9")
        return text.encode("latin-1")
    if name == "tabs":
        return MODEL.format(cookie="", note="tabs").replace("    ", "\t").encode()
    if name == "no-newline":
        return MODEL.format(cookie="", note="no final newline").rstrip("\n").encode() + (
            b"\n\n\ndef unused() -> None:\n    return None"
        )
    raise AssertionError(name)


SHAPES = ["crlf", "bom", "latin1", "tabs", "no-newline"]


@pytest.mark.parametrize("shape", SHAPES)
def test_patch_and_fix_keep_the_file_shape(shape: str, tmp_path: Path) -> None:
    original = _shape(shape)
    root = tmp_path / "project"
    (root / "models").mkdir(parents=True)
    path = root / "models" / "gram.py"
    path.write_bytes(original)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)

    report = scan_file(str(path))
    (finding,) = [f for f in report.findings if f.is_error]
    fix = finding.fix
    assert fix is not None and (fix.verified, fix.remaining) == (True, ())

    patch = tmp_path / "fix.patch"
    result = runner.invoke(app, ["scan", str(path), "--patch", str(patch)])
    assert result.exit_code == 1, result.output
    assert patch.read_bytes().startswith(b"--- a/models/gram.py\n+++ b/models/gram.py\n")
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
    applied = path.read_bytes()
    path.write_bytes(original)

    result = runner.invoke(app, ["scan", str(path), "--fix", "--no-backup"])
    assert result.exit_code == 0, result.output
    fixed = path.read_bytes()
    assert fixed == applied

    # the edit went in, in the file's own encoding, line endings and indentation
    sep = b"\r\n" if shape == "crlf" else b"\n"
    indent = b"\t\t" if shape == "tabs" else b" " * 8
    assert sep + indent + b'with torch.autocast(device_type="cuda", enabled=False):' + sep in fixed
    assert fixed.startswith(b"\xef\xbb\xbf") == (shape == "bom")
    if shape == "crlf":
        assert b"\n" not in fixed.replace(b"\r\n", b"")
    if shape == "latin1":
        assert b"caf\xe9" in fixed  # still Latin-1, not UTF-8
    if shape == "no-newline":
        assert fixed.endswith(b"return None")
    changed = [
        (a, b) for a, b in zip(original.splitlines(), fixed.splitlines(), strict=False) if a != b
    ]
    assert changed, "the file was not changed"
    assert scan_file(str(path)).errors == 0
