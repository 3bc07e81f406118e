"""Exact findings for one fixture model per finding kind: code, kind, op, module, line, verdict."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from nan_hunter.findings import Report, Severity
from tests.conftest import FIXTURES, marker_line, scanned


def _fixture_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_expect_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(path: Path, attribute: str = "EXPECTED") -> Any:
    return getattr(_fixture_module(path), attribute)


OP_FIXTURES = sorted(
    p for p in FIXTURES.glob("fx_*.py")
    if isinstance(_expected(p), dict) and _expected(p)["kind"] != "bad_input"
)


CPU_POLICY_FIXTURES = sorted(
    p for p in FIXTURES.glob("fx_*.py") if hasattr(_fixture_module(p), "EXPECTED_CPU_POLICY")
)
CLEAN_UNDER_CUDA = sorted(
    p for p in FIXTURES.glob("fx_*.py")
    if _expected(p) is None and p.stem not in ("fx_user_error", "fx_shape_mismatch")
)


def _scan(path: Path, **options: Any) -> Report:
    return scanned(path, **options)


@pytest.mark.parametrize("path", OP_FIXTURES, ids=lambda p: p.stem)
def test_first_culprit_is_exact(path: Path) -> None:
    expected = _expected(path)
    _assert_first_culprit(path, expected, _scan(path, **expected.get("options", {})))


@pytest.mark.parametrize("path", CPU_POLICY_FIXTURES, ids=lambda p: p.stem)
def test_cpu_policy_differs_from_cuda_policy(path: Path) -> None:
    """CPU autocast's op lists hide CUDA failures (BCELoss, FP16 inverse) and invent others
    (``x.pow(2)`` overflowing in FP16): the same model under ``policy=cpu``."""
    expected = _expected(path, "EXPECTED_CPU_POLICY")
    report = _scan(path, policy="cpu")
    assert report.target.policy == "cpu"
    if expected is None:
        assert [f.code for f in report.findings if f.is_error] == []
    else:
        _assert_first_culprit(path, expected, report)


@pytest.mark.parametrize("path", CLEAN_UNDER_CUDA, ids=lambda p: p.stem)
def test_clean_under_the_cuda_policy(path: Path) -> None:
    """Clean as trained with the standard recipe: CUDA autocast and GradScaler's default scale."""
    report = _scan(path, grad_scale=65536.0)
    assert report.target.policy == "cuda"
    assert report.status == "clean", [(f.code, f.op, f.location) for f in report.findings]
    assert report.loss_scale is not None and not report.loss_scale.empty


def test_gradient_underflow_without_loss_scaling_is_reported() -> None:
    """fx_rmsnorm_pow's forward is fine under CUDA, but its normalised gradients (x ~ 600, so
    d/dx ~ 1/600) are mostly subnormal in FP16 without a loss scale."""
    report = _scan(FIXTURES / "fx_rmsnorm_pow.py", grad_scale="none")
    boundary, finding = report.findings
    # where it happens: the gradient of the FP32 norm cast down to fc's FP16 output ...
    assert (boundary.code, boundary.op, boundary.modules) == ("NH402", "Tensor.__mul__", ("fc",))
    assert "lost at the FP32 -> float16 cast without loss scaling" in boundary.message
    # ... and what fc's parameters get from it
    assert (finding.code, finding.severity.value, finding.phase.value) == (
        "NH402", "warning", "backward"
    )
    assert finding.module == "fc"
    assert report.loss_scale is not None and report.loss_scale.recommended is not None
    assert f"init_scale=2**{report.loss_scale.recommended}" in finding.message


def _assert_first_culprit(path: Path, expected: dict[str, Any], report: Report) -> None:
    severity = expected.get("severity", "error")
    first = next(f for f in report.findings if f.severity.value == severity)
    assert first.code == expected["code"]
    assert first.kind.value == expected["kind"]
    assert first.op == expected["op"]
    assert first.module == expected["module"]
    assert first.phase.value == expected["phase"]
    assert first.location is not None
    assert Path(first.location.file) == path
    assert first.location.line == marker_line(path, "# <- culprit")
    if severity == "error":
        assert first.origin is True
        assert first.fp32_rerun is not None
        assert first.fp32_rerun.finite is expected["fp32_finite"]
    if "upstream_line_marker" in expected:
        assert first.upstream is not None
        assert first.upstream.location is not None
        assert first.upstream.location.line == marker_line(path, expected["upstream_line_marker"])


@pytest.mark.parametrize("path", OP_FIXTURES, ids=lambda p: p.stem)
def test_only_the_expected_errors(path: Path) -> None:
    """Propagation is counted, not listed: each fixture has exactly one error (or none)."""
    expected = _expected(path)
    report = _scan(path, **expected.get("options", {}))
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert len(errors) == (0 if expected.get("severity") == "warning" else 1), [
        (f.code, f.op, f.location) for f in errors
    ]


def test_bad_input_names_tensor_and_indices() -> None:
    report = _scan(FIXTURES / "fx_bad_input.py")
    assert report.ops == 0  # nothing ran: no op is blamed
    (finding,) = report.findings
    assert (finding.code, finding.kind.value, finding.location) == ("NH001", "bad_input", None)
    assert "args[0]" in finding.message
    assert "1 NaN and 1 inf" in finding.message
    assert "[0, 0], [1, 3]" in finding.message


def test_clean_fixture_is_clean_and_traced() -> None:
    report = _scan(FIXTURES / "fx_clean.py")
    assert report.status == "clean"
    assert report.findings == ()
    assert report.ops > 0 and report.backward_nodes > 0
    assert report.exit_code() == 0


def test_matrix_inverse_verdict_and_reach() -> None:
    """The FP32 reference says how far the culprit's output goes and that it is finite."""
    report = _scan(FIXTURES / "fx_cast_overflow.py")
    first = report.findings[0]
    assert first.fp32_rerun is not None
    assert first.fp32_rerun.own_inputs_finite is True
    assert first.fp32_rerun.abs_max is not None and 100 < first.fp32_rerun.abs_max < 65504
    assert first.inputs[0].dtype == "float32" and first.inputs[0].abs_max is not None
    assert first.inputs[0].abs_max > 65504
    assert first.outputs[0].dtype == "float16" and first.outputs[0].nan > 0


def test_eps_culprit_is_blamed_upstream() -> None:
    """0/0 in FP32 on its own FP16 inputs: the cause is the eps that vanished upstream."""
    report = _scan(FIXTURES / "fx_eps_underflow.py")
    first = report.findings[0]
    assert first.fp32_rerun is not None
    assert first.fp32_rerun.finite is True
    assert first.fp32_rerun.own_inputs_finite is False
    assert first.upstream is not None and first.upstream.reason == "eps"
    assert first.upstream.op == "Tensor.__add__"
    assert "1.00e-08" in first.message


def test_real_bug_gets_no_autocast_patch() -> None:
    report = _scan(FIXTURES / "fx_real_nan.py")
    first = report.findings[0]
    assert first.fix is not None and first.fix.diff is None
    assert first.fix.applicability.value == "display-only"
    assert "not a precision problem" in first.message


def test_same_scan_twice_gives_same_findings() -> None:
    a = _scan(FIXTURES / "fx_eps_underflow.py")
    b = _scan(FIXTURES / "fx_eps_underflow.py")
    assert a.findings == b.findings
    assert (a.ops, a.backward_nodes, a.propagated) == (b.ops, b.backward_nodes, b.propagated)


def test_non_finite_values_that_only_become_indices_are_contained() -> None:
    """log(0) = -inf turned into an integer index (as in T5's position buckets) harms nothing:
    it is reported at info severity, and the scan exits 0."""
    import torch
    from torch import nn

    import nan_hunter

    class Buckets(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 4)

        def forward(self, pos: torch.Tensor) -> torch.Tensor:
            scaled = torch.log(pos.float()) * 2
            idx = torch.where(pos < 2, pos, scaled.clamp(max=7).long())
            return self.emb(idx)

    report = nan_hunter.scan(Buckets(), torch.arange(6))
    (finding,) = report.findings
    assert (finding.code, finding.op, finding.severity.value) == ("NH301", "torch.log", "info")
    assert finding.notes[0].startswith("contained:")
    assert report.exit_code() == 0
