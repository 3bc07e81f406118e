"""NH004: a forward that asks which device it runs on takes the CPU's path in a scan that
predicts a CUDA run; the report says the CUDA path was not checked, never that it is clean."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.errors import NanHunterError
from nan_hunter.project.config import load_settings

MODEL = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            {body}


    def build_model():
        torch.manual_seed(0)
        return Net()


    def sample_batch():
        torch.manual_seed(0)
        return torch.randn(4, 8)
    """
)

ASKING = {
    "autocast wrapper enabled=x.is_cuda": (
        "with torch.autocast('cuda', enabled=x.is_cuda):\n"
        "            return self.fc(x).sum()",
        ".is_cuda",
    ),
    "CPU-only early return by device.type": (
        "if x.device.type == 'cpu':\n"
        "            return self.fc(x).sum()\n"
        "        return (self.fc(x) * 1e6).exp().sum()",
        ".device.type",
    ),
    "autocast wrapper enabled=x.device.type == 'cuda'": (
        "with torch.autocast('cuda', enabled=x.device.type == 'cuda'):\n"
        "            return self.fc(x).sum()",
        ".device.type",
    ),
    "is_cpu": ("return self.fc(x).sum() if x.is_cpu else self.fc(x).exp().sum()", ".is_cpu"),
    "CPU-only early return by torch.cuda.is_available()": (
        "if not torch.cuda.is_available():\n"
        "            return self.fc(x).sum()\n"
        "        return (self.fc(x) * 1e6).exp().sum()",
        "torch.cuda.is_available()",
    ),
    "get_device": (
        "return self.fc(x).sum() if x.get_device() < 0 else self.fc(x).exp().sum()",
        ".get_device()",
    ),
}

NOT_ASKING = {
    "device= argument": "return (self.fc(x) + torch.ones(8, device=x.device)).sum()",
    "dtype read": "return self.fc(x).to(x.dtype).sum()",
    "autocast following the device": (
        "with torch.autocast(device_type=x.device.type, enabled=False):\n"
        "            return self.fc(x).sum()"
    ),
    "device type kept, not compared": "kind = x.device.type\n        return self.fc(x).sum()",
}


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(body=body), encoding="utf-8")
    return path


@pytest.mark.parametrize("shape", ASKING, ids=list(ASKING))
def test_a_device_query_in_the_forward_is_reported_as_not_checked(
    shape: str, tmp_path: Path
) -> None:
    body, asked = ASKING[shape]
    path = _write(tmp_path, body)
    report = scan_file(str(path), load_settings())
    found = [f for f in report.findings if f.code == "NH004"]
    assert len(found) == 1, report.findings
    finding = found[0]
    assert finding.severity.value == "error"
    assert finding.location is not None and finding.location.line == 11
    assert f"`{asked}`" in finding.message
    assert "a CUDA run may take a path this scan did not run" in finding.message
    assert report.status != "clean"
    (note,) = report.target.unchecked
    expected = asked.lstrip(".")
    assert note == f"the path a CUDA run takes: the forward asked {expected} at model.py:11"


@pytest.mark.parametrize("shape", NOT_ASKING, ids=list(NOT_ASKING))
def test_reading_the_device_for_placement_is_not_a_query(shape: str, tmp_path: Path) -> None:
    path = _write(tmp_path, NOT_ASKING[shape])
    report = scan_file(str(path), load_settings())
    assert [f.code for f in report.findings] == []
    assert report.target.unchecked == ()
    assert report.status == "clean"


def test_a_scan_on_the_device_it_predicts_has_no_other_path(tmp_path: Path) -> None:
    path = _write(tmp_path, ASKING["autocast wrapper enabled=x.is_cuda"][0])
    report = scan_file(str(path), load_settings(overrides={"policy": "cpu"}))
    assert "NH004" not in [f.code for f in report.findings]
    assert report.target.unchecked == ()


def test_a_query_in_an_installed_library_is_not_the_models(tmp_path: Path) -> None:
    lib = tmp_path / "site-packages" / "asker"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(
        "def on_cuda(x):\n    return x.is_cuda\n", encoding="utf-8"
    )
    path = _write(tmp_path, "import sys\n"
                  f"        sys.path.insert(0, {str(lib.parent)!r})\n"
                  "        import asker\n"
                  "        return self.fc(x).sum() if not asker.on_cuda(x) else x.sum()")
    report = scan_file(str(path), load_settings())
    assert "NH004" not in [f.code for f in report.findings]


def test_the_cli_shows_the_unchecked_cuda_path_and_fails(tmp_path: Path) -> None:
    path = _write(tmp_path, ASKING["autocast wrapper enabled=x.is_cuda"][0])
    result = CliRunner().invoke(app, ["scan", str(path)])
    assert result.exit_code == 1, result.stdout
    assert "not checked  the path a CUDA run takes: the forward asked is_cuda at model.py:11" \
        in result.stdout
    assert "error[NH004] not_checked" in result.stdout
    assert "clean:" not in result.stdout
    ignored = CliRunner().invoke(app, ["scan", str(path), "--ignore", "NH004"])
    assert ignored.exit_code == 0, ignored.stdout


@pytest.mark.parametrize("body", ["return self.fc(x).sum()", "raise ValueError('boom')"])
def test_torch_cuda_queries_are_put_back_after_a_scan(body: str, tmp_path: Path) -> None:
    import torch

    originals = (torch.cuda.is_available, torch.cuda.device_count)
    path = _write(tmp_path, body)
    with contextlib.suppress(NanHunterError):  # the model's error: the functions come back
        scan_file(str(path), load_settings())
    assert (torch.cuda.is_available, torch.cuda.device_count) == originals
