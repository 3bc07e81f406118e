"""JSON report against its schema, and golden text/JSON reports of the examples and fixtures.

Regenerate the golden files after an intended change with ``pytest --update-golden``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

from nan_hunter.findings import Report
from nan_hunter.report import render
from nan_hunter.report.json_report import SCHEMA, report_dict
from tests.conftest import EXAMPLES, FIXTURES, GOLDEN, fixture_options, scanned

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "nan_hunter" / "report" / "report.schema.json"
ALL_MODELS = sorted(EXAMPLES.glob("*.py")) + sorted(
    p for p in FIXTURES.glob("fx_*.py") if p.stem not in ("fx_user_error", "fx_shape_mismatch")
)


def _stable(report: Report) -> Report:
    """The report with its timing zeroed, for byte-stable golden files."""
    return dataclasses.replace(report, seconds=0.0)


@pytest.mark.parametrize("path", ALL_MODELS, ids=lambda p: p.stem)
def test_json_report_matches_schema(path: Path) -> None:
    data = report_dict(scanned(path))
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    assert data["schema"] == SCHEMA
    assert data["status"] == ("findings" if data["findings"] else "clean")
    assert data["summary"]["errors"] == sum(f["severity"] == "error" for f in data["findings"])


def test_schema_rejects_a_finding_without_location() -> None:
    data = report_dict(scanned(EXAMPLES / "matrix_inverse.py"))
    data["findings"][0]["location"] = None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))


def _options(path: Path) -> dict[str, object]:
    return fixture_options(path)


GOLDEN_CASES = [
    (EXAMPLES / "matrix_inverse.py", "text"),
    (EXAMPLES / "matrix_inverse.py", "json"),
    (EXAMPLES / "attention_unscaled.py", "text"),
    (EXAMPLES / "clean_mlp.py", "text"),
    (FIXTURES / "fx_out_of_range_warning.py", "json"),
] + [  # one golden text report per rule, from its fixture
    (p, "text")
    for p in sorted(FIXTURES.glob("fx_*.py"))
    if p.stem not in ("fx_user_error", "fx_shape_mismatch", "fx_clean")
]


@pytest.mark.parametrize(
    ("path", "fmt"), GOLDEN_CASES, ids=[f"{p.stem}.{f}" for p, f in GOLDEN_CASES]
)
def test_golden_report(path: Path, fmt: str, update_golden: bool) -> None:
    rendered = render(_stable(scanned(path, **_options(path))), fmt)
    golden = GOLDEN / f"{path.stem}.{'txt' if fmt == 'text' else 'json'}"
    if update_golden or not golden.exists():
        golden.write_text(rendered, encoding="utf-8")
        if not update_golden:
            pytest.fail(f"{golden.name} did not exist; written now, check it in")
    assert rendered == golden.read_text(encoding="utf-8")


def test_a_fix_not_re_scanned_says_so() -> None:
    """``--no-verify`` (or a search that stopped before it): the fix was not tried, which is not
    the same as a fix that failed its re-scan ("NOT verified")."""
    report = scanned(EXAMPLES / "matrix_inverse.py", verify_fixes=False)
    text = render(report, "text")
    assert "[safe, not re-scanned]" in text
    assert "NOT verified" not in text
