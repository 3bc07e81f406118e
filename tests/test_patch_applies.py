"""Each suggested patch applies with git apply and patch -p1, compiles, and re-scans clean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Severity
from tests.conftest import EXAMPLES, FIXTURES, PRECISION_FIXES, ROOT, scanned

PATCHED = PRECISION_FIXES


def _first_diff(path: Path) -> str:
    """The first safe fix's diff (an eps whose change of the loss is not verified comes
    first, the FP32 region after it)."""
    report = scanned(path)
    first = report.findings[0]
    assert first.fix is not None, first
    fix = next(f for f in (first.fix, *first.fix.alternatives)
               if f.applicability.value == "safe")
    assert fix.diff is not None, first
    return fix.diff


@pytest.mark.parametrize("path", PATCHED, ids=lambda p: p.stem)
def test_patch_applies_compiles_and_rescans_clean(path: Path, tmp_path: Path) -> None:
    diff = _first_diff(path)
    rel = path.relative_to(ROOT)  # patch paths are relative to the project root
    work = tmp_path / "git"
    (work / rel).parent.mkdir(parents=True)
    shutil.copy(path, work / rel)
    (work / "fix.patch").write_text(diff)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=work, check=True)
    patched = work / rel
    compile(patched.read_text(), str(patched), "exec")

    if shutil.which("patch"):
        other = tmp_path / "patch"
        (other / rel).parent.mkdir(parents=True)
        shutil.copy(path, other / rel)
        subprocess.run(
            ["patch", "-p1", "-s", "-i", str(work / "fix.patch")], cwd=other, check=True
        )
        assert (other / rel).read_text() == patched.read_text()

    rescan = scan_file(str(patched))
    errors = [(f.code, f.op, f.location) for f in rescan.findings if f.severity is Severity.ERROR]
    if path.parent == EXAMPLES:
        assert errors == []
    else:
        # The forward origin is gone; fx_eps_large_change keeps a true backward overflow: the
        # gradient of x / 1e-8 cannot fit FP16 (see its NH401).
        assert [e for e in errors if e[0] != "NH401"] == []
    # an FP32 region, or (finer) the values upcast where they leave a matmul or module
    added = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any("enabled=False" in ln or ".float()" in ln for ln in added), diff


def test_eps_fix_leaves_the_true_gradient_overflow_reported(tmp_path: Path) -> None:
    path = FIXTURES / "fx_eps_large_change.py"
    patched = tmp_path / path.relative_to(ROOT)
    patched.parent.mkdir(parents=True)
    shutil.copy(path, patched)
    (tmp_path / "fix.patch").write_text(_first_diff(path))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    (finding,) = [f for f in scan_file(str(patched)).findings if f.severity is Severity.ERROR]
    assert (finding.code, finding.phase.value) == ("NH401", "backward")
    assert finding.fp32_rerun is not None and finding.fp32_rerun.finite is True
