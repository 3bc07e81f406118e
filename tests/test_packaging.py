"""Packaging: the data files ship inside the package, found the same way installed or not.

The full check (build the sdist and wheel, list their files, install the wheel into a fresh venv
and scan every example from another folder) is ``.ci/run``; these are the fast parts of it.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import nan_hunter
from nan_hunter.cli import app
from nan_hunter.precision.policy import load_policy
from nan_hunter.project.config import DEFAULT_CONFIG
from nan_hunter.project.resources import config_dir, policy_dir
from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _setup_data_packages() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("_nh_setup", ROOT / "setup.py")
    assert spec is not None
    source = (ROOT / "setup.py").read_text(encoding="utf-8")
    namespace: dict[str, object] = {}
    # only the mapping: running setup() itself would start a build
    exec(source.split("setup(", 1)[0], namespace)
    mapping = namespace["DATA_PACKAGES"]
    assert isinstance(mapping, dict)
    return mapping


def test_no_symlink_in_the_package() -> None:
    assert not (ROOT / "nan_hunter" / "configs").exists()
    assert not any(p.is_symlink() for p in (ROOT / "nan_hunter").rglob("*"))


def test_resources_find_the_tables_and_defaults() -> None:
    assert (config_dir() / "default.yaml").is_file()
    assert sorted(p.name for p in policy_dir().glob("*.yaml")) == ["cpu.yaml", "cuda.yaml"]
    assert config_dir() / "default.yaml" == DEFAULT_CONFIG
    assert load_policy("cuda").device == "cuda"
    assert load_policy("cpu").device == "cpu"


def test_every_config_file_is_package_data() -> None:
    """setup.py maps each configs/ folder into the package, and pyproject.toml's package-data
    globs take every file in it: a new file or folder in configs/ fails here until listed."""
    mapping = _setup_data_packages()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = data["tool"]["setuptools"]["package-data"]
    folders = {folder: package for package, folder in mapping.items()}
    for path in sorted((ROOT / "configs").rglob("*")):
        if path.is_dir():
            assert path.relative_to(ROOT).as_posix() in folders, f"{path} is not mapped"
            continue
        package = folders[path.parent.relative_to(ROOT).as_posix()]
        assert any(fnmatch.fnmatch(path.name, g) for g in globs[package]), f"{path} not shipped"


def test_setup_ships_every_folder_of_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each folder of nan_hunter/ with modules is a package (it has an __init__.py) that
    setup.py's ``packages`` names: the wheel holds cli/, core/, engine/, process/, project/..."""
    import setuptools

    declared: dict[str, object] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: declared.update(kwargs))
    monkeypatch.chdir(ROOT)
    exec((ROOT / "setup.py").read_text(encoding="utf-8"), {"__name__": "__main__"})
    packages = declared["packages"]
    assert isinstance(packages, list)
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "nan_hunter").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    for folder in sorted(folders):
        assert (ROOT / folder.replace(".", "/") / "__init__.py").is_file(), folder
        assert folder in packages, f"{folder} is not in setup.py's packages"
    assert {"nan_hunter.cli", "nan_hunter.core", "nan_hunter.engine", "nan_hunter.process",
            "nan_hunter.project"} <= set(packages)


def test_check_dist_requires_the_data_files() -> None:
    spec = importlib.util.spec_from_file_location("_check_dist", ROOT / ".ci" / "check_dist.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    wheel = check.expected_wheel()
    assert {
        "nan_hunter/configs/default.yaml",
        "nan_hunter/configs/policies/cuda.yaml",
        "nan_hunter/configs/policies/cpu.yaml",
        "nan_hunter/report/report.schema.json",
        "nan_hunter/py.typed",
        "nan_hunter/__main__.py",
    } <= wheel
    sdist = check.expected_sdist()
    assert {"setup.py", "configs/policies/cuda.yaml", "examples/matrix_inverse.py"} <= sdist


def test_version_option() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"nan-hunter {nan_hunter.__version__}\n"


def test_python_dash_m(tmp_path: Path) -> None:
    """``python -m nan_hunter`` is the CLI; run from another folder, nothing but the version."""
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "--version"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"nan-hunter {nan_hunter.__version__}\n", ""
    )
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "rules"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("NH001  error")


def test_numpy_warning_is_hidden_by_the_cli(tmp_path: Path) -> None:
    """Without numpy, ``import torch`` warns "Failed to initialize NumPy"; the CLI must not show
    it. Simulated by hiding numpy from the child's imports."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _NoNumpy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy' or name.startswith('numpy.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'numpy'\")\n"
        "sys.meta_path.insert(0, _NoNumpy())\n",
        encoding="utf-8",
    )
    model = ROOT / "examples" / "clean_mlp.py"
    env = {"PYTHONPATH": f"{tmp_path}{':' + str(ROOT)}", "PATH": "/usr/bin:/bin"}
    code = "from nan_hunter.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "scan", str(model), "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    probe = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import torch; torch.zeros(1).numpy()"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False, env=env,
    )
    assert "numpy" in probe.stderr.lower()  # the simulation does hide numpy
