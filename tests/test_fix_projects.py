"""Real project layouts: a package with relative imports and data files, and a culprit inside an
installed library. Fixes are verified in an overlay of the project and apply from its root."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.fixes.verify import verify_fixes
from nan_hunter.report import render
from tests.conftest import FIXTURES, ROOT

PROJECTS = FIXTURES / "projects"
SCHEMA = ROOT / "nan_hunter" / "report" / "report.schema.json"
runner = CliRunner()


def _git_project(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(PROJECTS / name, root)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _apply(root: Path, patch: Path, tool: str) -> None:
    args = ["git", "apply"] if tool == "git" else ["patch", "-p1", "-s", "-i"]
    args.append(str(patch))
    subprocess.run(args, cwd=root, check=True)


@pytest.mark.parametrize("tool", ["git", "patch"])
def test_package_culprit_gets_a_verified_fix_that_applies_from_the_project_root(
    tmp_path: Path, tool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tool == "patch" and shutil.which("patch") is None:
        pytest.skip("no patch(1)")
    root = _git_project(tmp_path, "audio_project")
    monkeypatch.chdir(tmp_path)  # not the project root: paths still come from the git top
    report = scan_file(str(root / "train.py"))
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.location is not None
    assert Path(finding.location.file) == root / "audiomodel" / "layers" / "pooling.py"
    assert finding.fix is not None and (finding.fix.verified, finding.fix.remaining) == (True, ())
    assert finding.fix.diff is not None and finding.fix.diff.startswith(
        "--- a/audiomodel/layers/pooling.py\n+++ b/audiomodel/layers/pooling.py\n"
    )
    patch = tmp_path / "fix.patch"
    result = runner.invoke(app, ["scan", str(root / "train.py"), "--patch", str(patch)])
    assert result.exit_code == 1, result.output
    before = (root / "train.py").read_bytes()
    _apply(root, patch, tool)
    assert (root / "train.py").read_bytes() == before
    assert "with torch.autocast" in (root / "audiomodel/layers/pooling.py").read_text()
    after = scan_file(str(root / "train.py"))
    assert after.errors == 0


def test_fix_writes_the_package_module_and_ends_clean(tmp_path: Path) -> None:
    root = _git_project(tmp_path, "audio_project")
    result = runner.invoke(app, ["scan", str(root / "train.py"), "--fix"])
    assert result.exit_code == 0, result.output
    assert f"fixed NH102 in {root / 'audiomodel/layers/pooling.py'}" in result.stderr
    assert (root / "audiomodel/layers/pooling.py.orig").exists()
    assert not list(tmp_path.glob("nan-hunter-verify-*"))


def test_installed_library_culprit_is_fixed_at_the_call_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The library lives in a site-packages folder outside the project, as pip would put it.
    site = tmp_path / "venv" / "site-packages"
    shutil.copytree(PROJECTS / "site-packages", site)
    monkeypatch.syspath_prepend(str(site))
    root = _git_project(tmp_path, "lib_user")
    library = site / "nh_tinylib" / "__init__.py"
    library_before = library.read_bytes()
    report = scan_file(str(root / "model.py"))
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.location is not None and Path(finding.location.file) == library
    assert finding.call_site is not None
    assert (Path(finding.call_site.file), finding.call_site.line) == (root / "model.py", 15)
    fix = finding.fix
    assert fix is not None and fix.files == (str(root / "model.py"),)
    assert (fix.verified, fix.remaining) == (True, ())
    assert fix.diff is not None and fix.diff.startswith("--- a/model.py\n+++ b/model.py\n")
    assert "+            g = nh_tinylib.gram(h.float())  # <- call site\n" in fix.diff
    sarif = json.loads(render(report, "sarif"))
    (result,) = sarif["runs"][0]["results"]
    (related,) = result["relatedLocations"]
    assert related["physicalLocation"]["region"]["startLine"] == 15
    assert related["message"]["text"].startswith("called from your code here")
    data = json.loads(render(report, "json"))
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    assert data["findings"][0]["call_site"]["line"] == 15
    (root / "fix.patch").write_text(fix.diff)
    _apply(root, root / "fix.patch", "git")
    assert library.read_bytes() == library_before
    assert scan_file(str(root / "model.py")).errors == 0


def test_dotted_module_spec_is_verified_from_the_overlay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _git_project(tmp_path, "audio_project")
    monkeypatch.chdir(root)
    report = scan_file("audiomodel.entry")
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.fix is not None and (finding.fix.verified, finding.fix.remaining) == (True, ())
    assert finding.fix.diff is not None
    (root / "fix.patch").write_text(finding.fix.diff)
    _apply(root, root / "fix.patch", "git")
    assert scan_file("audiomodel.entry").errors == 0  # the patched module, not a cached one


def test_verification_puts_the_project_modules_back(tmp_path: Path) -> None:
    root = _git_project(tmp_path, "audio_project")
    report = scan_file(str(root / "train.py"), verify=False)
    before = sys.modules["audiomodel.layers.pooling"]
    verified = verify_fixes(report, lambda f: scan_file(str(f), verify=False), root / "train.py")
    assert verified.findings[0].fix is not None and verified.findings[0].fix.verified is True
    assert sys.modules["audiomodel.layers.pooling"] is before
    assert not [
        name for name, module in list(sys.modules.items())
        if "nan-hunter-verify-" in (getattr(module, "__file__", None) or "")
    ]
