"""--fix-all fixes a chain's first cause and re-scans before fixing what it caused: a backward
origin found beside a fixed forward origin waits for the re-scan, where it is usually gone."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.findings import (
    Applicability,
    Edit,
    Finding,
    Fix,
    Kind,
    Phase,
    Report,
    ScanTarget,
    Severity,
)
from nan_hunter.fixes.workflow import first_causes, fix_all

SOURCE = "stats = (x * x).mean()\nmodel_in_fp32 = False\n"


def _finding(code: str, phase: Phase, fix: Fix | None) -> Finding:
    return Finding(code, Severity.ERROR, Kind.OVERFLOW, phase, "Tensor.__mul__", "norm", None,
                   True, code, fix=fix)


def _report(path: Path, *findings: Finding) -> Report:
    return Report(ScanTarget(str(path), "half", "float16", "cpu", "cuda"), findings, 1, 0, 0,
                  0.0)


def _fixes(path: Path) -> tuple[Fix, Fix]:
    norm = Fix("norm statistics in FP32", Applicability.SAFE,
               (Edit(str(path), 0, 23, "stats = (x.float() * x.float()).mean()\n"),),
               verified=True)
    whole = Fix("keep the model in FP32", Applicability.SAFE,
                (Edit(str(path), 23, 45, "model_in_fp32 = True\n"),), verified=True)
    return norm, whole


def test_the_backward_origin_waits_for_the_rescan_after_the_forward_fix(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    norm, whole = _fixes(path)
    scans = [
        _report(path, _finding("NH103", Phase.FORWARD, norm),
                _finding("NH401", Phase.BACKWARD, whole)),
        _report(path),  # the forward fix was enough: the backward NaN was its consequence
    ]
    result = fix_all(path, lambda _path: scans.pop(0), backup=False)
    assert result.stopped == "clean"
    assert path.read_text() == "stats = (x.float() * x.float()).mean()\nmodel_in_fp32 = False\n"
    (first,) = result.rounds
    assert [f.code for a in first.applied for f in a.fixed] == ["NH103"]


def test_a_backward_origin_alone_is_fixed(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    _, whole = _fixes(path)
    report = _report(path, _finding("NH401", Phase.BACKWARD, whole))
    assert first_causes(report) is report


def test_a_backward_origin_stays_when_no_forward_fix_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    norm, whole = _fixes(path)
    unverified = Fix(norm.title, norm.applicability, norm.edits, verified=False)
    report = _report(path, _finding("NH103", Phase.FORWARD, unverified),
                     _finding("NH401", Phase.BACKWARD, whole))
    assert [f.code for f in first_causes(report).findings] == ["NH103", "NH401"]
