"""A model with an error in its own file and another in a sibling module it imports
(``layers.py``), the most ordinary multi-file project. Verifying the first fix re-scans a mirror
of the project in which unedited files are symbolic links; building the re-scan's fix for the
sibling's finding resolved the link to the project's file and then asked for the mirror's path
relative to that folder. Before, the whole scan ended in "internal error: ValueError:
'/tmp/nan-hunter-verify-.../layers.py' is not in the subpath of ..." (exit 2), with or without
git; so did a model whose sibling module is a link to a file outside the project. Now both
findings get fixes, verified as far as they can be, and ``--fix-all`` writes both files."""

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

MODEL = """\
import torch
from torch import nn

from layers import Gram


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gram = Gram()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        self.monitor = self.gram(x).detach()  # logged, not trained on
        h = self.fc(x) * 300.0
        b = (h * h).mean(-1)
        return b / (b.abs().amax() + 1.0)


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(2, 8, 16)
"""


@pytest.mark.parametrize("layout", ["plain", "git", "linked-sibling"])
def test_errors_in_the_model_file_and_a_sibling_module(layout: str, work: Path) -> None:
    (work / "model.py").write_text(MODEL)
    layers = work / "layers.py"
    if layout == "linked-sibling":  # a shared file, linked into the project from elsewhere
        shared = work.parent / "shared"
        shared.mkdir()
        layers = shared / "layers.py"
        os.symlink(layers, work / "layers.py")
    layers.write_text(LAYERS)
    if layout == "git":
        subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--format", "json"])
    assert result.exit_code == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    assert [(f["code"], Path(f["location"]["file"]).name) for f in findings] == [
        ("NH102", "layers.py"), ("NH103", "model.py")
    ]
    # NH103's fix verifies alone (NH102's value never reaches the loss); NH102's re-scan still
    # has NH103's non-finite loss, so it waits for --fix-all's next round
    assert [f["fix"]["verified"] for f in findings] == [False, True]
    assert findings[0]["fix"]["remaining"][-1] == "the loss is not finite after the fix"
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--fix-all", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "clean"
    assert "round 1: fixed NH103" in result.stderr and "round 2: fixed NH102" in result.stderr
    assert "enabled=False" in layers.read_text()  # the Gram matmul: a region
    # the elementwise square: its operands upcast, the Linear before it left in FP16
    assert "        b = (h.float() * h.float()).mean(-1)\n" in (work / "model.py").read_text()
    assert (work / "layers.py").is_symlink() == (layout == "linked-sibling")
