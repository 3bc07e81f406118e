"""``nan-hunter scan .`` in a project whose tests import the model function
(``tests/test_model.py``: ``from model import build_model``). A folder stands for its model
files; before a file that only imported ``build_model`` counted as one, so the test module
was scanned too and failed (here "No module named 'model'": pytest puts the project on the
path, nan-hunter puts the file's own folder), and the run exited 2. Now a file that imports the
model function without binding the batch function (``sample_batch``) is not a model file; one
that defines it, or imports both (a training script), still is."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.project.targets import defines, expand_paths
from tests.conftest import EXAMPLES

TEST_MODULE = """\
import torch

from model import build_model


def test_output_shape():
    assert build_model()(torch.randn(2, 16)).shape[0] == 2
"""

TRAIN = """\
from model import build_model, sample_batch

if __name__ == "__main__":
    print(build_model()(*sample_batch()))
"""


def test_a_test_module_importing_the_model_function_is_not_a_model_file(work: Path) -> None:
    shutil.copy(EXAMPLES / "clean_mlp.py", work / "model.py")
    (work / "tests").mkdir()
    (work / "tests" / "test_model.py").write_text(TEST_MODULE)
    (work / "train.py").write_text(TRAIN)
    (work / "helpers.py").write_text("def build_model():\n    return None\n")
    assert expand_paths(["."], "build_model", "sample_batch") == ["helpers.py", "model.py",
                                                                   "train.py"]
    # without a batch function (--batch-file), the model function alone decides, as before
    assert "tests/test_model.py" in expand_paths(["."], "build_model", None)
    assert not defines(work / "tests" / "test_model.py", "build_model", "sample_batch")
    assert defines(work / "helpers.py", "build_model", "sample_batch")  # its error is shown
    (work / "helpers.py").unlink()
    result = CliRunner().invoke(app, ["scan", ".", "-q"])
    assert result.exit_code == 0, result.output
    assert "test_model.py" not in result.output
