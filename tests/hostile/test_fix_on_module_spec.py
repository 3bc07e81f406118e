"""``--fix`` and ``--fix-all`` on a model given as ``pkg.module`` (a ``src/`` layout
whose model module uses relative imports). Before, the re-scan after the write imported the
module's *file* instead of the module, so the relative import failed: ``--fix`` wrote the fix
and then exited 2 with "attempted relative import with no known parent package" (a changed
file and a failed CI step), and ``--fix-all`` failed before fixing anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.hostile.sources import GRAM_LAYERS

LAYERS = GRAM_LAYERS

NET = """\
import torch

from ..layers import Gram
from . import helpers


def build_model():
    torch.manual_seed(0)
    return Gram()


def sample_batch():
    return helpers.batch()
"""

HELPERS = """\
import torch


def batch():
    torch.manual_seed(0)
    return torch.randn(2, 8, 16)
"""


def _project(work: Path) -> Path:
    pkg = work / "src" / "mypkg"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(LAYERS)
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "net.py").write_text(NET)
    (pkg / "models" / "helpers.py").write_text(HELPERS)
    return pkg


@pytest.mark.parametrize("flag", ["--fix", "--fix-all"])
def test_fix_of_a_dotted_module_rescans_the_module(
    flag: str, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _project(work)
    monkeypatch.chdir(work / "src")
    result = CliRunner().invoke(
        app, ["scan", "mypkg.models.net", flag, "--format", "json", "-q"],
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "clean"
    assert report["target"]["file"] == os.path.join("mypkg", "models", "net.py")
    assert (pkg / "layers.py.orig").read_text() == LAYERS
    fixed = (pkg / "layers.py").read_text()
    assert 'with torch.autocast(device_type="cuda", enabled=False):' in fixed
    assert f"fixed NH102 in {pkg / 'layers.py'}" in result.stderr


def test_a_package_module_given_as_a_file_says_how_to_scan_it(work: Path) -> None:
    """Before the error stopped at Python's "attempted relative import with no known
    parent package", with nothing on what to run instead."""
    pkg = _project(work)
    result = CliRunner().invoke(app, ["scan", "src/mypkg/models/net.py", "-q"])
    assert (result.exit_code, result.stdout) == (2, "")
    net = pkg / "models" / "net.py"
    assert result.stderr.splitlines()[0] == (
        f"nan-hunter: error: ImportError while importing src/mypkg/models/net.py: attempted "
        "relative import with no known parent package; net.py is a module of the package "
        f"mypkg.models: scan it as `nan-hunter scan mypkg.models.net` from {work / 'src'} "
        f"(at {net}:3)"
    )
