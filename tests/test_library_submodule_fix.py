"""A culprit inside an installed library gets the narrowest submodule kept in FP32 by hooks
registered from the user's ``build_model()``, not the whole library call in FP32."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Applicability, Edit, Fix
from nan_hunter.fixes.cost import covers
from tests.conftest import FIXTURES

PROJECTS = FIXTURES / "projects"


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    site = tmp_path / "venv" / "site-packages"  # installed as pip would put it
    shutil.copytree(PROJECTS / "site-packages", site)
    monkeypatch.syspath_prepend(str(site))
    root = tmp_path / "deep_user"
    shutil.copytree(PROJECTS / "deep_user", root)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root, site / "nh_deeplib" / "__init__.py"


def test_the_chosen_fix_keeps_the_culprits_submodule_in_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the fix was the FP32 region around `self.encoder(x)`: the whole library call.
    root, library = _project(tmp_path, monkeypatch)
    library_before = library.read_bytes()
    report = scan_file(str(root / "model.py"))
    (finding,) = [f for f in report.findings if f.is_error]
    assert (finding.code, finding.op, finding.module) == (
        "NH102", "Tensor.__matmul__", "encoder.blocks.1.mix"
    )
    fix = finding.fix
    assert fix is not None
    assert fix.title == (
        "Keep encoder.blocks.1.mix (Mix) in FP32 from build_model(): hooks disable autocast "
        "for it alone and cast its inputs to float32 (the library is not edited)"
    )
    assert (fix.verified, fix.remaining, fix.fp32_module) == (True, (), "encoder.blocks.1.mix")
    assert fix.files == (str(root / "model.py"),)
    assert fix.cost is not None
    # Mix's projection and Gram matrix: 24 of the forward's 97 matmul FLOP units
    assert round(fix.cost.fp32_matmul_share, 4) == round(24 / 97, 4)
    assert fix.cost.baseline_matmul_share == 0.0
    assert fix.alternatives == ()  # the call-site region keeps more: not re-scanned
    assert fix.diff is not None
    assert '+    return _run_in_fp32(model, "encoder.blocks.1.mix")\n' in fix.diff
    (root / "fix.patch").write_text(fix.diff)
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True)
    assert library.read_bytes() == library_before
    assert scan_file(str(root / "model.py"), verify=False).errors == 0


def _fix(module: str | None, line: int) -> Fix:
    edit = Edit("/nonexistent.py", line, line + 1, "x\n")
    return Fix("t", Applicability.SAFE, (edit,), fp32_module=module)


def test_a_module_holding_the_kept_one_covers_it() -> None:
    narrow, parent = _fix("encoder.blocks.1.mix", 10), _fix("encoder.blocks.1", 10)
    call = _fix("encoder", 99)
    assert covers(parent, narrow) and covers(call, narrow) and covers(_fix("", 3), narrow)
    assert not covers(narrow, parent)
    assert not covers(_fix("encoder.blocks.10", 10), _fix("encoder.blocks.1", 10))
