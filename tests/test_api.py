"""The Python API: ``nan_hunter.scan`` on an in-memory model, and the ``Report`` renderers."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.errors import ConfigError, UserCodeError
from nan_hunter.findings import Kind, Phase, Report, Severity
from nan_hunter.project.config import Settings
from nan_hunter.report import render
from tests.conftest import ROOT, marker_line

SCHEMA_FILE = ROOT / "nan_hunter" / "report" / "report.schema.json"
THIS_FILE = Path(__file__).resolve()


class Overflowing(nn.Module):
    """``head`` is an ``nn.Linear`` whose outputs (~1.5e5) exceed FP16's 65504."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Identity()
        self.head = nn.Linear(8, 8)
        with torch.no_grad():
            self.head.weight.uniform_(50.0, 150.0)
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.head(h)  # <- api culprit


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _overflowing() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Overflowing()
    return model, 100.0 + 100.0 * torch.rand(4, 8)


@pytest.fixture(scope="module")
def report() -> Report:
    model, batch = _overflowing()
    return nan_hunter.scan(model, batch)


def test_scan_is_reachable_from_the_package() -> None:
    from nan_hunter import api

    assert nan_hunter.scan is api.scan
    assert "dtype" in (api.scan.__doc__ or "") and "backward" in (api.scan.__doc__ or "")


def test_scan_finds_the_linear_overflow(report: Report) -> None:
    assert report.status == "findings"
    assert report.errors == 1
    (finding,) = report.findings
    assert finding.code == "NH102"
    assert finding.severity is Severity.ERROR
    assert finding.kind is Kind.OVERFLOW
    assert finding.phase is Phase.FORWARD
    assert finding.op == "torch.nn.functional.linear"
    assert finding.module == "head"
    assert finding.origin
    assert finding.location is not None
    assert Path(finding.location.file).resolve() == THIS_FILE
    assert finding.location.line == marker_line(THIS_FILE, "# <- api culprit")
    assert finding.location.code == "return self.head(h)  # <- api culprit"
    assert finding.fp32_rerun is not None and finding.fp32_rerun.finite
    assert finding.fp32_rerun.abs_max is not None and 65504 < finding.fp32_rerun.abs_max < 2e5
    # The API verifies fixes as the CLI does: the class is re-imported from the patched file.
    assert finding.fix is not None and finding.fix.edits
    assert (finding.fix.verified, finding.fix.remaining) == (True, ())
    (out,) = finding.outputs
    assert out.dtype == "float16" and out.shape == (4, 8)
    assert out.posinf == 32 and out.nan == 0
    # The target names this file (the model's class is defined here) and the default settings.
    assert Path(report.target.file) == THIS_FILE
    assert (report.target.mode, report.target.dtype, report.target.policy) == (
        "autocast",
        "float16",
        "cuda",
    )
    assert report.ops == 1  # linear; Identity runs no op and the default loss is not traced
    assert report.backward_nodes > 0


def test_json_matches_the_schema(report: Report) -> None:
    data = json.loads(render(report, "json"))
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    assert data["schema"] == "nan-hunter/report/v1"
    assert data["status"] == "findings"
    (finding,) = data["findings"]
    assert finding["code"] == "NH102"
    assert finding["op"] == "torch.nn.functional.linear"
    assert finding["module"] == "head"
    assert finding["location"]["line"] == marker_line(THIS_FILE, "# <- api culprit")
    assert finding["location"]["file"] == "tests/test_api.py"
    assert data["summary"]["errors"] == 1


def test_markdown_and_text_rendering(report: Report) -> None:
    markdown = render(report, "markdown")
    assert "NH102" in markdown
    assert "torch.nn.functional.linear" in markdown
    text = render(report)
    assert "error[NH102]" in text
    assert f"--> tests/test_api.py:{marker_line(THIS_FILE, '# <- api culprit')}" in text
    assert "\x1b[" not in text
    assert "\x1b[" in render(report, color=True)
    assert nan_hunter.render is render  # the public call, lazily from the package
    assert not hasattr(report, "render")  # a Report is data: it imports no output layer
    with pytest.raises(ValueError, match="unknown format"):
        render(report, "yaml")


def test_clean_model_reports_clean() -> None:
    torch.manual_seed(0)
    report = nan_hunter.scan(Clean(), torch.randn(6, 8))
    assert report.status == "clean"
    assert report.findings == ()
    assert report.exit_code() == 0
    assert json.loads(render(report, "json"))["findings"] == []
    assert "error[" not in render(report)


@pytest.mark.parametrize("dtype", ["bfloat16", torch.bfloat16])
def test_bfloat16_option_makes_the_overflow_clean(dtype: object) -> None:
    model, batch = _overflowing()
    report = nan_hunter.scan(model, batch, dtype=dtype)
    assert report.target.dtype == "bfloat16"
    assert report.errors == 0
    assert report.status == "clean"


def test_backward_false_runs_no_backward() -> None:
    model, batch = _overflowing()
    with_backward = nan_hunter.scan(model, batch)
    without = nan_hunter.scan(model, batch, backward=False)
    assert with_backward.backward_nodes > 0
    assert without.backward_nodes == 0
    assert without.loss_scale is None
    assert [f.code for f in without.findings] == ["NH102"]


def test_select_and_ignore_pass_through() -> None:
    model, batch = _overflowing()
    assert nan_hunter.scan(model, batch, ignore=["NH1"]).findings == ()
    assert nan_hunter.scan(model, batch, ignore=("NH102",)).findings == ()
    assert nan_hunter.scan(model, batch, select="NH3").findings == ()
    assert [f.code for f in nan_hunter.scan(model, batch, select=["NH102"]).findings] == ["NH102"]


def test_options_apply_on_top_of_settings() -> None:
    model, batch = _overflowing()
    report = nan_hunter.scan(
        model, batch, settings=Settings(backward=False, ignore=("NH5",)), dtype="bfloat16"
    )
    assert report.target.dtype == "bfloat16"
    assert report.backward_nodes == 0
    assert report.status == "clean"


def test_unknown_option_is_a_config_error() -> None:
    model, batch = _overflowing()
    with pytest.raises(
        ConfigError, match=r"unknown option 'dtyp'.*known options: accumulation_length, backward"
    ):
        nan_hunter.scan(model, batch, dtyp="bfloat16")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "float64"}, r"nan_hunter\.scan\(\): 'dtype' must be one of float16, bfloat16"),
        ({"dtype": torch.float64}, r"'dtype' must be one of float16, bfloat16, float32, got "),
        ({"backward": "no"}, r"'backward' must be true or false"),
        ({"max_warnings": -1}, r"'max_warnings' must be a finite number >= 0"),
    ],
)
def test_bad_option_value_is_a_config_error(options: dict[str, object], message: str) -> None:
    model, batch = _overflowing()
    with pytest.raises(ConfigError, match=message):
        nan_hunter.scan(model, batch, **options)


def test_model_that_is_not_a_module_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Module"):
        nan_hunter.scan(lambda x: x, torch.ones(2))  # type: ignore[arg-type]


def test_loss_fn_is_used_and_its_errors_are_user_code_errors() -> None:
    torch.manual_seed(0)
    seen: list[object] = []

    def loss_fn(output: torch.Tensor, batch: object) -> torch.Tensor:
        seen.append(batch)
        return output.float().pow(2).sum()

    batch = torch.randn(6, 8)
    report = nan_hunter.scan(Clean(), batch, loss_fn)
    assert report.status == "clean"
    # each pass gets its own copy of the batch (a model may write into its inputs)
    assert seen and isinstance(seen[0], torch.Tensor) and torch.equal(seen[0], batch)

    def broken(output: torch.Tensor, batch: object) -> torch.Tensor:
        raise KeyError("labels")

    with pytest.raises(UserCodeError, match="KeyError during loss_fn"):
        nan_hunter.scan(Clean(), batch, broken)


def test_class_without_source_file_scans() -> None:
    """A model class defined where ``inspect`` finds no source (``python -c``, a REPL)."""
    namespace: dict[str, object] = {"nn": nn, "torch": torch}
    exec(  # a class whose module has no file
        compile(
            "class Doubler(nn.Module):\n"
            "    def forward(self, x):\n"
            "        return x * 2.0\n",
            "<string>",
            "exec",
        ),
        namespace,
    )
    model_cls = namespace["Doubler"]
    assert isinstance(model_cls, type)
    report = nan_hunter.scan(model_cls(), torch.ones(2, 3))
    assert report.status == "clean"
    assert report.target.unchecked == (
        "the backward was not analysed: the model has no parameters: there is nothing to train",
    )
    assert report.target.file in ("<model>", "<string>")
