"""The precision check (NH6xx): each op against FP32, the origin of precision loss, and the
loss-level verdict; per fixture shape in BF16 and FP16, at the right op and line, and the
fixed versions clean."""

from __future__ import annotations

from typing import Any

import pytest

from nan_hunter.findings import Report
from tests.conftest import FIXTURES, marker_line, scanned

PRECISION = FIXTURES / "precision"

CASES = [
    # fixture, dtype, extra options, code, op, line marker
    ("positions_arange", "bfloat16", {}, "NH601", "torch.arange", "# <- positions"),
    ("positions_arange", "float16", {}, "NH601", "torch.arange", "# <- positions"),
    ("one_minus_cos", "bfloat16", {}, "NH602", "Tensor.__rsub__", "# <- cancel"),
    ("one_minus_cos", "float16", {}, "NH602", "Tensor.__rsub__", "# <- cancel"),
    ("half_cumsum", "bfloat16", {"mode": "half"}, "NH603", "Tensor.cumsum", "# <- accumulate"),
    ("half_cumsum", "float16", {"mode": "half"}, "NH603", "Tensor.cumsum", "# <- accumulate"),
    ("large_exp", "bfloat16", {}, "NH609", "torch.exp", "# <- amplify"),
]


def _scan(name: str, dtype: str, options: dict[str, Any]) -> Report:
    return scanned(PRECISION / f"{name}.py", dtype=dtype, precision_check="on", **options)


def _precision_codes(report: Report) -> list[tuple[str, str, int]]:
    return [
        (f.code, f.op, f.location.line if f.location else 0)
        for f in report.findings if f.code.startswith("NH6")
    ]


@pytest.mark.parametrize(("name", "dtype", "options", "code", "op", "marker"), CASES,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_found_at_the_op_and_line(
    name: str, dtype: str, options: dict[str, Any], code: str, op: str, marker: str
) -> None:
    path = PRECISION / f"{name}.py"
    report = _scan(name, dtype, options)
    assert _precision_codes(report) == [(code, op, marker_line(path, marker))]
    assert report.precision_check is not None and report.precision_check.compared > 0


@pytest.mark.parametrize(("name", "dtype", "options"), [c[:3] for c in CASES],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_fixed_version_is_clean(name: str, dtype: str, options: dict[str, Any]) -> None:
    report = _scan(f"{name}_fixed", dtype, options)
    assert _precision_codes(report) == []
    # the error at the fixed op fell to the format's rounding
    assert report.precision_check is not None and report.precision_check.largest_error is not None
    rounding = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    assert report.precision_check.largest_error < 16 * rounding


def test_nh601_names_what_the_rounded_positions_ruin() -> None:
    (finding,) = _scan("positions_arange", "bfloat16", {}).findings
    assert finding.message == (
        "torch.arange makes integers up to 4095 in bfloat16, which holds integers exactly only "
        "up to 256; Tensor.cos at positions_arange.py:22 is then off by 200% of its range"
    )


def test_the_loss_verdict_measures_the_distance_from_fp32() -> None:
    """``1 - cos`` is 0 in BF16 where FP32 has ~5e-5: the loss is off by 100%; the gradients
    (through cos's derivative, not the cancelled difference) stay aligned."""
    verdict = _scan("one_minus_cos", "bfloat16", {}).precision_check
    assert verdict is not None
    assert verdict.loss_error == pytest.approx(1.0)
    assert verdict.grad_cosine is not None and verdict.grad_cosine > 0.999
    assert verdict.largest_at == "Tensor.__rsub__ (one_minus_cos.py:15)"


def test_float16_scans_skip_the_check_unless_asked() -> None:
    path = PRECISION / "one_minus_cos.py"
    assert scanned(path).precision_check is None
    assert scanned(path, dtype="bfloat16").precision_check is not None  # auto: on with BF16
    assert scanned(path, dtype="bfloat16", precision_check="off").precision_check is None


def test_the_verdict_is_in_the_text_header_and_json() -> None:
    from nan_hunter.report import render

    report = _scan("one_minus_cos", "bfloat16", {})
    text = render(report, "text")
    assert "precision vs FP32: loss off by 100%" in text
    import json

    data = json.loads(render(report, "json"))
    assert data["precision"]["loss_relative_error"] == pytest.approx(1.0)
    assert data["precision"]["ops_compared"] == report.precision_check.compared  # type: ignore[union-attr]


