"""The range map (headroom per module, the ops closest to the limits) and the --min-headroom gate.

Exact values of the bundled examples: the clean MLP's largest FP16 activation is fc1's output,
2.578125 (headroom 65504 / 2.578125 = 25407.6x); its gradients at GradScaler's 2**16 reach 6896
at the head, 9.5x below 65504.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import nan_hunter
from nan_hunter.cli import app
from nan_hunter.project.config import load_settings
from nan_hunter.project.discovery import discover
from nan_hunter.report import render
from tests.conftest import EXAMPLES, FIXTURES, GOLDEN, scanned

runner = CliRunner()
FP16_MAX = 65504.0


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.stdout


def test_clean_mlp_range_map_lists_every_module_in_execution_order() -> None:
    m = scanned(EXAMPLES / "clean_mlp.py").range_map
    assert m is not None
    assert (m.format, m.limit, m.loss_scale) == ("float16", FP16_MAX, 65536.0)
    assert [r.module for r in m.modules] == ["fc1", "bn", "", "fc2", "norm", "head"]
    fc1 = m.modules[0]
    assert fc1.forward.abs_max == 2.578125
    assert m.headroom(fc1.forward) == pytest.approx(FP16_MAX / 2.578125)
    assert fc1.backward is not None and fc1.backward.abs_max == 4216.0
    norm = m.modules[4]
    assert norm.backward is None  # its gradients stay FP32 (layer_norm runs in FP32)


def test_clean_mlp_closest_ops_are_the_scaled_gradients() -> None:
    m = scanned(EXAMPLES / "clean_mlp.py").range_map
    assert m is not None
    top = [(o.phase, o.module, o.op, o.extent.abs_max) for o in m.top]
    assert top == [
        ("backward", "head", "torch.nn.functional.linear", 6896.0),
        ("backward", "fc2", "torch.nn.functional.linear", 5164.0),
        ("backward", "fc1", "torch.nn.functional.linear", 4216.0),
        ("backward", "", "torch.nn.functional.gelu", 2282.0),
        ("backward", "bn", "torch.nn.functional.batch_norm", 1735.0),
    ]
    assert m.bottom == ()  # nothing below FP16's smallest normal


def test_matrix_inverse_culprit_has_no_headroom_and_its_cause_is_beyond_the_limit() -> None:
    m = scanned(EXAMPLES / "matrix_inverse.py").range_map
    assert m is not None
    matmul, inverse = m.top[:2]
    assert (matmul.op, matmul.extent.overflowed, m.headroom(matmul.extent)) == (
        "torch.matmul", True, 0.0,
    )
    assert inverse.op == "torch.inverse"
    assert inverse.extent.abs_max == pytest.approx(308979.03125)
    assert m.headroom(inverse.extent) == pytest.approx(FP16_MAX / 308979.03125)
    assert inverse.location is not None and inverse.location.line == 45


def test_subnormal_activations_lead_the_underflow_list() -> None:
    m = scanned(FIXTURES / "fx_subnormal_activations.py").range_map
    assert m is not None
    first = m.bottom[0]
    assert (first.phase, first.module, first.op) == ("forward", "fc", "torch.nn.functional.linear")
    assert first.extent.tiny_share > 0.25


def test_json_has_headroom_per_module_and_closest_ops() -> None:
    data = json.loads(render(scanned(EXAMPLES / "clean_mlp.py"), "json"))
    fc1 = data["headroom"]["modules"][0]
    assert fc1["module"] == "fc1"
    assert fc1["forward"]["headroom"] == pytest.approx(FP16_MAX / 2.578125)
    first = data["closest"]["overflow"][0]
    assert (first["module"], first["phase"], first["abs_max"]) == ("head", "backward", 6896.0)
    assert first["location"]["line"] == 34
    assert data["closest"]["underflow"] == []


def test_text_lists_five_closest_ops_and_every_module_with_range_map() -> None:
    report = scanned(EXAMPLES / "clean_mlp.py")
    short = render(report, "text")
    assert short.count("\n  headroom ") == 5
    assert "margin   forward 2.54e+04x in fc1, backward 9.499x in head" in short
    assert "range map" not in short
    full = render(report, "text", range_map=True)
    table = full.split("range map\n", 1)[1]
    assert [line.split()[0] for line in table.splitlines()[1:7]] == [
        "fc1", "bn", "(root)", "fc2", "norm", "head",
    ]


@pytest.mark.parametrize(
    ("factor", "flagged"), [(8.0, []), (25400.0, []), (25410.0, ["fc1"])],
)
def test_min_headroom_flags_clean_mlp_only_within_the_factor(
    factor: float, flagged: list[str]
) -> None:
    """fc1's 2.578125 is 25407.6x below 65504: a margin of 25410 catches it, 25400 does not."""
    report = scanned(EXAMPLES / "clean_mlp.py", min_headroom=factor)
    assert [f.module for f in report.findings if f.code == "NH503"] == flagged


def test_min_headroom_8_turns_ci_red_only_when_activations_are_within_8x() -> None:
    near = str(FIXTURES / "fx_near_overflow.py")  # 8360: 7.8x below 65504
    clean = str(EXAMPLES / "clean_mlp.py")
    code, out = invoke("scan", near, "--min-headroom", "8", "--fail-on", "warning")
    assert code == 1 and "warning[NH503]" in out
    assert invoke("scan", near, "--min-headroom", "7", "--fail-on", "warning")[0] == 0
    assert invoke("scan", near, "--fail-on", "warning")[0] == 0  # the gate is off by default
    assert invoke("scan", clean, "--min-headroom", "8", "--fail-on", "warning")[0] == 0


def test_min_headroom_is_a_project_setting(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.nan-hunter]\nmin-headroom = 8\n")
    settings = load_settings(project=discover(tmp_path))
    assert settings.min_headroom == 8.0
    assert load_settings().min_headroom == 0.0


def test_range_map_text_of_clean_mlp_matches_golden(update_golden: bool) -> None:
    report = dataclasses.replace(scanned(EXAMPLES / "clean_mlp.py"), seconds=0.0)
    rendered = render(report, "text", range_map=True)
    golden = GOLDEN / "clean_mlp.range_map.txt"
    if update_golden or not golden.exists():
        golden.write_text(rendered, encoding="utf-8")
        if not update_golden:
            pytest.fail(f"{golden.name} did not exist; written now, check it in")
    assert rendered == golden.read_text(encoding="utf-8")


def test_python_api_takes_min_headroom() -> None:
    report = nan_hunter.scan_file(str(FIXTURES / "fx_near_overflow.py"),
                                  load_settings(overrides={"min_headroom": 8.0}))
    assert [f.code for f in report.findings] == ["NH503"]


def test_an_op_whose_backward_overflowed_has_no_headroom() -> None:
    """fx_backward_inf: the loss's cast back to FP16 turns a 1e5 gradient into inf (NH401)."""
    m = scanned(FIXTURES / "fx_backward_inf.py").range_map
    assert m is not None
    first = m.top[0]
    assert (first.phase, first.module, first.op) == ("backward", "(loss)", "Tensor.float")
    assert first.extent.overflowed and m.headroom(first.extent) == 0.0
    assert first.extent.abs_max == 100000.0


def test_an_error_in_the_loss_highlights_the_loss_row() -> None:
    from nan_hunter.report.range_map import culprit_modules

    assert "(loss)" in culprit_modules(scanned(FIXTURES / "fx_backward_inf.py"))
