"""A user's ``@torch.autocast("cuda", enabled=False)`` decorator, built when the model file is
imported, protects its function in a scan that predicts CUDA on a CPU, as it does on a GPU.

Before, only autocast objects built during the scan's passes (a ``with`` statement) were mapped
to the CPU; a decorator's object, built at import, kept acting on the (absent) CUDA autocast, so
the region it protects was scanned in FP16 and reported as an overflow CUDA would never see."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch

from nan_hunter.api import scan_file
from nan_hunter.project.loader import import_user_module

DECORATORS = {
    "positional": '@torch.autocast("cuda", enabled=False)',
    "keyword": '@torch.autocast(device_type="cuda", enabled=False)',
    "amp": '@torch.amp.autocast("cuda", enabled=False)',
    "cuda-amp": "@torch.cuda.amp.autocast(enabled=False)",
    "object": "@NO_AUTOCAST",
}
"""The spellings found in public code; ``object``: one autocast object made at import, shared."""

MODEL = """\
import torch
from torch import nn

NO_AUTOCAST = torch.autocast("cuda", enabled=False)


{helper_decorator}
def amplify(fc, x):
    return fc(x.float()) * 30000.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    {forward_decorator}
    def forward(self, x):
        return {body}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.block(x).float() * 1e-3)


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(1)
    return torch.randn(4, 8) * 10
"""
"""Under autocast, the linear's output times 30000 reaches 4.2e5: beyond FP16 unless the decorated
function (the linear and the product) runs with autocast off."""


def _model(decorator: str, where: str) -> str:
    on_forward = where == "forward"
    return MODEL.format(
        helper_decorator="" if on_forward else decorator,
        forward_decorator=decorator if on_forward else "",
        body="self.fc(x.float()) * 30000.0" if on_forward else "amplify(self.fc, x)",
    )


def _scan(path: Path):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.autocast
        return scan_file(str(path), verify=False)


SHAPES = list(itertools.product(DECORATORS, ("forward", "helper")))


@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(s) for s in SHAPES])
def test_a_decorator_built_at_import_disables_autocast_where_cuda_would(
    shape: tuple[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "model.py"
    path.write_text(_model(DECORATORS[shape[0]], shape[1]))
    report = _scan(path)
    assert report.target.policy == "cuda" and report.target.device == "cpu"
    assert [f.code for f in report.findings] == []


@pytest.mark.parametrize("where", ["forward", "helper"])
def test_without_the_decorator_the_same_model_overflows(where: str, tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(_model("", where))
    assert [f.code for f in _scan(path).findings if f.is_error] == ["NH103"]


def test_the_users_autocast_object_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(_model("@NO_AUTOCAST", "forward"))
    module = import_user_module(str(path))
    assert _scan(path).findings == ()
    assert module.NO_AUTOCAST.device == "cuda"
    assert not torch.is_autocast_enabled("cpu")
