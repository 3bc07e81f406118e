"""A project without git whose model script (``proj/scripts/train_model.py``) puts the
project folder on ``sys.path`` and imports its package (``proj/mylib/layers.py``, where the
overflow is); the same holds for a package installed with ``pip install -e``.

Before, :
- run from ``proj/scripts`` (or from a folder outside the project), the fix's verification
  mirrored only the entry's folder: "not verified: the re-scan failed: .../mylib/layers.py is
  outside the project root .../scripts", so ``--fix`` wrote nothing, and ``--patch`` wrote
  ``a/layers.py``, which applies from nowhere in the project;
- from any folder, after ``--fix`` wrote ``mylib/layers.py`` the re-scan in the same process
  used the ``mylib.layers`` imported before the write: the report still showed NH102 and the
  exit code was 1; ``--fix-all`` stopped with "no fix left to apply (NH102: no automatic
  fix)"."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.hostile.sources import GRAM_LAYERS

pytestmark = pytest.mark.slow  # real scan processes (isolation is the subject)

LAYERS = GRAM_LAYERS

SCRIPT = """\
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from mylib.layers import Gram  # noqa: E402


def build_model():
    torch.manual_seed(0)
    return Gram()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(2, 8, 16)
"""


def _project(work: Path) -> Path:
    proj = work / "proj"
    (proj / "scripts").mkdir(parents=True)
    (proj / "mylib").mkdir()
    (work / "elsewhere").mkdir()
    (proj / "mylib" / "__init__.py").write_text("")
    (proj / "mylib" / "layers.py").write_text(LAYERS)
    (proj / "scripts" / "train_model.py").write_text(SCRIPT)
    return proj


def _scan(cwd: Path, *args: str) -> tuple[int, str, str]:
    os.chdir(cwd)
    result = CliRunner().invoke(app, ["scan", *args, "-q"], env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


WHERE = {"proj": ("proj", "scripts/train_model.py"),
         "scripts": ("proj/scripts", "train_model.py"),
         "elsewhere": ("elsewhere", "../proj/scripts/train_model.py")}


@pytest.mark.parametrize("flag", ["--fix", "--fix-all"])
@pytest.mark.parametrize("where", sorted(WHERE))
def test_fix_in_a_sibling_package_is_verified_written_and_rescanned(
    where: str, flag: str, work: Path
) -> None:
    proj = _project(work)
    folder, model = WHERE[where]
    code, out, err = _scan(work / folder, model, flag, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["status"] == "clean"
    layers = proj / "mylib" / "layers.py"
    assert f"fixed NH102 in {layers} (original kept as layers.py.orig)" in err
    assert (proj / "mylib" / "layers.py.orig").read_text() == LAYERS
    assert 'with torch.autocast(device_type="cuda", enabled=False):' in layers.read_text()


def test_patch_of_a_sibling_package_applies_from_the_project_folder(work: Path) -> None:
    proj = _project(work)
    code, _, err = _scan(proj / "scripts", "train_model.py", "--patch", str(work / "fix.patch"))
    assert code == 1, err
    patch = (work / "fix.patch").read_text()
    assert patch.startswith("--- a/mylib/layers.py\n+++ b/mylib/layers.py\n")
    subprocess.run(["patch", "-p1", "-s", "-i", str(work / "fix.patch")], cwd=proj, check=True)
    assert "enabled=False" in (proj / "mylib" / "layers.py").read_text()
