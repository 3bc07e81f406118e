"""An exception during a scan is the model's when its code (or an op it called, passed on by
nan-hunter's tracer, emulation or autocast kernels) raised it, and nan-hunter's own when
nan-hunter's code did: that one is an ``InternalError`` from the original, never "the model
raised ..." (which sends users to debug a model that is fine). Each place of ours inside the
model's call: ``tests/hostile/test_error_ownership.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter import scan
from nan_hunter.errors import InternalError, UserCodeError
from nan_hunter.precision import gradients
from nan_hunter.project import resources
from nan_hunter.trace import deferred


@pytest.mark.parametrize(
    ("module", "name"),
    [(gradients, "fill_row"), (deferred, "_magnitude_bits")],
    ids=["gradient-log-in-backward", "statistics-in-forward"],
)
def test_our_own_exception_is_not_blamed_on_the_model(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str
) -> None:
    # A bug in nan-hunter's own code: a helper it calls is no longer callable, so the
    # TypeError is raised in nan-hunter's frame.
    monkeypatch.setattr(module, name, None)
    not_callable = "TypeError: 'NoneType' object is not callable"
    with pytest.raises(InternalError, match=not_callable) as raised:
        scan(nn.Linear(4, 2), torch.ones(3, 4))
    assert isinstance(raised.value.__cause__, TypeError)


class _Raises(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.where = where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.where == "python":
            raise KeyError("the model's own")
        if self.where == "op":
            return h @ torch.ones(5, 2)  # a shape error raised by the op, through the tracer
        if self.where == "function":
            return _FailingBackward.apply(h)
        return h


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("the model's backward")


@pytest.mark.parametrize(
    ("where", "kind", "phase"),
    [("python", "KeyError", "forward"), ("op", "RuntimeError", "forward"),
     ("function", "ValueError", "backward")],
)  # fmt: skip
def test_the_models_exception_is_still_the_models(where: str, kind: str, phase: str) -> None:
    with pytest.raises(UserCodeError, match=f"the model raised {kind} during {phase}"):
        scan(_Raises(where), torch.ones(3, 4))


_SYMLINKED_SCAN = """
import sys, torch
from torch import nn
import nan_hunter
from nan_hunter.errors import InternalError, UserCodeError

class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
    def forward(self, x):
        return self.fc(x) @ torch.ones(5, 2)  # the model's shape error, passed on by the tracer

try:
    nan_hunter.scan(Bad(), torch.ones(3, 4))
except UserCodeError as exc:
    print("model:", exc)
print("from:", nan_hunter.__file__)
"""


def test_the_models_error_is_the_models_when_the_package_folder_has_another_name(
    tmp_path: Path,
) -> None:
    # An install where site-packages/nan_hunter is a symlink to a folder of another name: the
    # op's error is the model's, and its line the user's (frames are told apart by their path
    # inside the package, not by a "/nan_hunter/" in it).
    real = tmp_path / "checkout" / "nh_package"
    package = Path(nan_hunter.__file__).resolve().parent
    shutil.copytree(package, real, ignore=shutil.ignore_patterns("__pycache__"))
    data = resources.config_dir()  # beside the package in a checkout, inside it in a wheel
    if data.parent != package:  # (in a wheel, copied with the package already)
        shutil.copytree(data, real.parent / "configs")
    site = tmp_path / "site"
    site.mkdir()
    (site / "nan_hunter").symlink_to(real, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", _SYMLINKED_SCAN], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"from: {site / 'nan_hunter' / '__init__.py'}" in done.stdout
    assert "model: the model raised RuntimeError during forward" in done.stdout
