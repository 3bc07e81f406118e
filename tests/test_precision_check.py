"""The precision check (NH6xx): each op against FP32, the origin of precision loss, and the
loss-level verdict; per fixture shape in BF16 and FP16, at the right op and line, and the
fixed versions clean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nan_hunter.findings import Fix, Report
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
    ("variance_offset", "bfloat16", {}, "NH602", "Tensor.__sub__", "# <- cancel"),
    ("variance_offset", "float16", {}, "NH602", "Tensor.__sub__", "# <- cancel"),
    ("log_one_plus", "bfloat16", {}, "NH609", "torch.log", "# <- log"),
    ("log_one_plus", "float16", {}, "NH609", "torch.log", "# <- log"),
    ("exp_minus_one", "bfloat16", {"mode": "half"}, "NH602", "Tensor.__sub__", "# <- cancel"),
    ("exp_minus_one", "float16", {"mode": "half"}, "NH602", "Tensor.__sub__", "# <- cancel"),
    ("rotary_matmul", "bfloat16", {}, "NH601", "Tensor.__matmul__", "# <- positions"),
    ("rotary_matmul", "float16", {}, "NH601", "Tensor.__matmul__", "# <- positions"),
    ("half_token_sum", "bfloat16", {"mode": "half"}, "NH603", "Tensor.sum", "# <- accumulate"),
    ("half_token_sum", "float16", {"mode": "half"}, "NH603", "Tensor.sum", "# <- accumulate"),
]

FIXED_LINES = {
    # fixture: the lines the verified fix writes (the same in BF16 and FP16)
    "positions_arange": [
        "        pos = torch.arange(h.shape[1], dtype=torch.float32)  # <- positions",
        "        ang = pos[:, None] * self.inv_freq[None, :]",
    ],
    "one_minus_cos": ["        d = 2 * torch.sin(theta / 2) ** 2  # <- cancel"],
    "half_cumsum": ["        c = p.cumsum(1, dtype=torch.float32)  # <- accumulate"],
    "large_exp": ["        s = 80 + self.fc(x).float()"],
    "variance_offset": ["        h = self.fc(x).float() + 100"],
    "log_one_plus": ["        return torch.log1p(p)  # <- log"],
    "exp_minus_one": ["        return torch.expm1(t)  # <- cancel"],
    "rotary_matmul": [
        '        with torch.autocast(device_type="cuda", enabled=False):',
        "            freqs = (self.inv_freq[:, None] @ pos[None, :]).transpose(0, 1)"
        "  # <- positions",
    ],
    "half_token_sum": ["        return per_token.sum(1, dtype=torch.float32)  # <- accumulate"],
}


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


def _added_lines(fix: Fix) -> list[str]:
    assert fix.diff is not None
    return [
        line[1:] for line in fix.diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


@pytest.mark.parametrize(("name", "dtype", "options"), [c[:3] for c in CASES],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_fix_is_verified_and_lean(name: str, dtype: str, options: dict[str, Any]) -> None:
    """The fix kept is the rewrite of the cause, or the fewest ops in FP32: verified by a
    re-scan with the precision check, no matmul moved to FP32 (the rotary product is the
    positions' own matmul, which the transformers fix runs in FP32 too)."""
    finding = next(f for f in _scan(name, dtype, options).findings if f.code.startswith("NH6"))
    fix = finding.fix
    assert fix is not None and fix.verified is True, fix
    assert _added_lines(fix) == FIXED_LINES[name]
    assert fix.cost is not None
    if name != "rotary_matmul":
        assert fix.cost.added_matmul_share == 0


@pytest.mark.parametrize(("name", "dtype", "options"), [
    # FP16's fixes are the same edits as BF16's (FIXED_LINES): their re-scans run with the slow
    # tests, to keep the default suite's time
    pytest.param(*c[:3], marks=[pytest.mark.slow] if c[1] == "float16" else [])
    for c in CASES
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_fix_applied_leaves_no_precision_finding(
    name: str, dtype: str, options: dict[str, Any], tmp_path: Path
) -> None:
    finding = next(f for f in _scan(name, dtype, options).findings if f.code.startswith("NH6"))
    assert finding.fix is not None
    text = (PRECISION / f"{name}.py").read_text()
    for edit in sorted(finding.fix.edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    patched = tmp_path / f"{name}.py"
    patched.write_text(text)
    report = scanned(patched, dtype=dtype, precision_check="on", verify_fixes=False, **options)
    assert _precision_codes(report) == []
    assert report.precision_check is not None and report.precision_check.largest_error is not None
    rounding = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    assert report.precision_check.largest_error < 16 * rounding


FIXED_FILES = sorted({c[0] for c in CASES} & {p.stem.removesuffix("_fixed")
                                               for p in PRECISION.glob("*_fixed.py")})


@pytest.mark.parametrize(("name", "dtype", "options"),
                         [c[:3] for c in CASES if c[0] in FIXED_FILES],
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




def test_a_fix_that_leaves_precision_lost_is_not_verified(tmp_path: Path) -> None:
    """FP32 positions alone: the rounded frequency they are multiplied by still puts the angles
    off by whole radians, so the re-scan's precision check finds the cos and sin; the
    verification names them and refuses the fix."""
    from nan_hunter.api import scan_file
    from nan_hunter.findings import Applicability
    from nan_hunter.fixes.edits import edits_between
    from nan_hunter.fixes.verify import verify_fix
    from nan_hunter.project.config import load_settings

    entry = tmp_path / "positions_arange.py"
    entry.write_text((PRECISION / "positions_arange.py").read_text())
    settings = load_settings(overrides={"dtype": "bfloat16", "verify_fixes": False})
    before = scan_file(str(entry), settings)
    (finding,) = before.findings
    text = entry.read_text()
    half_fixed = text.replace("dtype=h.dtype)  # <- pos", "dtype=torch.float32)  # <- pos")
    fix = Fix("FP32 positions only", Applicability.SAFE, edits_between(entry, text, half_fixed))
    verdict = verify_fix(fix, finding, before, lambda p: scan_file(str(p), settings), entry)
    assert not verdict.verified
    assert verdict.remaining[:2] == (
        "NH609 Tensor.cos at positions_arange.py:22 (new: the original scan did not have it)",
        "NH609 Tensor.sin at positions_arange.py:22 (new: the original scan did not have it)",
    )


def test_the_text_and_markdown_reports_show_a_warnings_fix() -> None:
    from nan_hunter.report import render

    report = _scan("one_minus_cos", "bfloat16", {})
    added = "+        d = 2 * torch.sin(theta / 2) ** 2  # <- cancel"
    text = render(report, "text")
    assert "  fix  Compute 1 - cos(x) as 2 * sin(x / 2) ** 2: the same value, without the " \
           "cancellation [safe, verified by re-scan;" in text
    assert added in text.splitlines()
    markdown = render(report, "markdown")
    assert "### Fix for NH602 · `tests/fixtures/precision/one_minus_cos.py:15`" in markdown
    assert added in markdown.splitlines()


def test_a_fix_after_which_no_error_is_smaller_is_not_verified() -> None:
    """The finding gone from the re-scan is not enough: the loss's distance from FP32 or the
    largest op error must at least halve (here both stay: the precision did not come back)."""
    import dataclasses

    from nan_hunter.fixes.verify import judge

    before = _scan("one_minus_cos", "bfloat16", {})
    (finding,) = before.findings
    check = before.precision_check
    assert check is not None and check.loss_error is not None
    same = dataclasses.replace(check, loss_error=check.loss_error * 0.9)
    # the re-scan's loss as FP32's (the loss check passes): only the precision measures differ
    after = dataclasses.replace(before, findings=(), precision_check=same,
                                loss=before.reference_loss)
    verdict = judge(finding, before, after, {})
    assert not verdict.verified
    assert verdict.remaining[-1].startswith("no error measurably smaller: the loss off FP32's by ")
    halved = dataclasses.replace(check, loss_error=check.loss_error * 0.5)
    assert judge(finding, before, dataclasses.replace(after, precision_check=halved), {}).verified


def test_a_structural_finding_is_verified_by_its_cause_going() -> None:
    """NH603 over a sum whose FP32 run is within the format's rounding: nothing measurably lost,
    so the fix holds when the finding goes, and says so."""
    report = _scan("half_token_sum", "bfloat16", {"mode": "half"})
    (finding,) = [f for f in report.findings if f.code == "NH603"]
    assert finding.fix is not None and finding.fix.verified is True
    assert finding.fix.remaining == (
        "nothing was measurably lost before it (the loss off FP32's by 0.0431%, the largest op "
        "error 0.472%): the finding's cause is gone",
    )
