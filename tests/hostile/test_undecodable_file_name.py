"""A model file whose name is not UTF-8 (``mod\\xe8le.py``, a Latin-1 name on a
UTF-8 system; Python holds it as ``mod\\udce8le.py``). Text, JSON, GitHub, Markdown and JUnit
reports were fine; before ``--format sarif`` ended in a raw ``UnicodeEncodeError:
'utf-8' codec can't encode character '\\udce8'`` traceback from ``urllib.parse.quote``,
exit 1 (read by CI as "findings") and no SARIF. Now the file's URI percent-encodes its bytes
(``mod%E8le.py``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES
from tests.test_report_emitters import SARIF_SCHEMA_FILE


def test_sarif_of_a_model_file_whose_name_is_not_utf8(work: Path) -> None:
    name = os.fsdecode(b"mod\xe8le.py")
    shutil.copy(EXAMPLES / "matrix_inverse.py", work / name)
    result = CliRunner().invoke(app, ["scan", name, "-q", "--format", "sarif"])
    assert result.exit_code == 1, result.output
    sarif = json.loads(result.stdout)
    jsonschema.validate(sarif, json.loads(SARIF_SCHEMA_FILE.read_text(encoding="utf-8")))
    (res,) = sarif["runs"][0]["results"]
    location = res["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "mod%E8le.py", "uriBaseId": "%SRCROOT%"}
