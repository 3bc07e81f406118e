"""``--format github`` from a subfolder of the repository (a CI step with
``working-directory: ml``). GitHub places an annotation by its ``file=``, a path from the
repository root; before it was the path from the working directory (``models/net.py``
for ``ml/models/net.py``), so the annotation missed the file in the pull request, while the
SARIF of the same run said ``ml/models/net.py``. Now both are repository paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES


def test_annotations_name_the_file_from_the_repository_root(work: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    (work / "ml" / "models").mkdir(parents=True)
    shutil.copy(EXAMPLES / "matrix_inverse.py", work / "ml" / "models" / "net.py")
    os.chdir(work / "ml")
    github = CliRunner().invoke(app, ["scan", "models", "--format", "github", "-q"])
    assert github.exit_code == 1, github.stderr
    first = github.stdout.splitlines()[0]
    assert first.startswith("::error file=ml/models/net.py,line=46,title=NH101 overflow::")
    # the summary line is for the log reader: relative to where the step runs
    assert github.stdout.splitlines()[-1] == (
        "nan-hunter: 1 error, 0 warnings in models/net.py"
    )
    sarif = CliRunner().invoke(app, ["scan", "models", "--format", "sarif", "-q"])
    (result,) = json.loads(sarif.stdout)["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "ml/models/net.py", "uriBaseId": "%SRCROOT%"}
