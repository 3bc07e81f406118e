"""An install without .py files (only legacy .pyc, as a compileall -b build leaves) scans, and
tells the model's errors from ours (which need no source: ``InternalError`` is raised where our
code fails). ``config.known_codes`` finds the rule codes there too (not only from
``rules/nh*.py`` file names: else every scan, the default config selecting ``NH``, would end in
"'select' has an unknown rule code 'NH'")."""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nan_hunter
from nan_hunter.project import resources

_SCAN = """
import torch
from torch import nn
import nan_hunter
from nan_hunter.project.config import known_codes
from nan_hunter.errors import InternalError, UserCodeError
from nan_hunter.trace import deferred

class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
    def forward(self, x):
        return self.fc(x) @ torch.ones(5, 2)  # the model's shape error, passed on by the tracer

print("codes:", len(known_codes()))
print("from:", nan_hunter.__file__)
try:
    nan_hunter.scan(Bad(), torch.ones(3, 4))
except UserCodeError as exc:
    print("model:", exc)
deferred._magnitude_bits = None  # a bug in nan-hunter's own statistics
try:
    nan_hunter.scan(nn.Linear(4, 2), torch.ones(3, 4))
except UserCodeError as exc:
    print("blamed on the model:", exc)
except InternalError as exc:
    print("ours:", exc.original)
"""


def test_an_install_without_sources_scans_and_tells_the_models_errors_from_ours(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    package = Path(nan_hunter.__file__).resolve().parent
    installed = site / "nan_hunter"
    shutil.copytree(package, installed, ignore=shutil.ignore_patterns("__pycache__"))
    data = resources.config_dir()  # beside the package in a checkout, inside it in a wheel
    if data.parent != package:
        shutil.copytree(data, installed / "configs")
    assert compileall.compile_dir(installed, quiet=1, legacy=True)
    for source in installed.rglob("*.py"):
        source.unlink()
    expected = {p.stem for p in (package / "rules").glob("nh*.py")}
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", _SCAN], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"from: {installed / '__init__.pyc'}" in done.stdout
    assert f"codes: {len(expected)}" in done.stdout
    assert "model: the model raised RuntimeError during forward" in done.stdout
    assert "ours: 'NoneType' object is not callable" in done.stdout
