"""The command line through typer's CliRunner: exit codes, formats, files, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES, FIXTURES

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def test_findings_exit_1_and_clean_exit_0() -> None:
    code, out, _ = invoke("scan", str(EXAMPLES / "matrix_inverse.py"))
    assert code == 1
    assert "error[NH101]" in out and "examples/matrix_inverse.py:46" in out
    code, out, _ = invoke("scan", str(EXAMPLES / "clean_mlp.py"))
    assert code == 0
    assert out.rstrip().splitlines()[-1].startswith("clean: ")


def test_exit_zero_forces_0() -> None:
    code, _, _ = invoke("scan", str(EXAMPLES / "matrix_inverse.py"), "--exit-zero")
    assert code == 0


def test_fail_on_warning() -> None:
    path = str(FIXTURES / "fx_out_of_range_warning.py")
    assert invoke("scan", path)[0] == 0
    assert invoke("scan", path, "--fail-on", "warning")[0] == 1


def test_json_to_stdout_and_file(tmp_path: Path) -> None:
    code, out, _ = invoke("scan", str(EXAMPLES / "attention_unscaled.py"), "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert data["schema"] == "nan-hunter/report/v1"
    assert data["status"] == "findings"
    assert data["findings"][0]["op"] == "Tensor.__matmul__"
    target = tmp_path / "report.json"
    code, out, err = invoke(
        "scan", str(EXAMPLES / "attention_unscaled.py"), "--format", "json", "--output", str(target)
    )
    assert code == 1 and out == ""
    assert json.loads(target.read_text())["findings"][0]["code"] == "NH102"
    assert "report written to" in err


def test_quiet_writes_report_and_patch_without_notes(tmp_path: Path) -> None:
    target, patch = tmp_path / "report.json", tmp_path / "fix.patch"
    code, out, err = invoke(
        "scan", str(EXAMPLES / "matrix_inverse.py"), "--format", "json", "--output", str(target),
        "--patch", str(patch), "--quiet", "--no-verify",
    )
    assert code == 1 and out == "" and err == ""
    assert json.loads(target.read_text())["findings"][0]["code"] == "NH101"
    assert patch.read_text().startswith("--- a/")


def test_patch_file_is_written(tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    code, _, err = invoke("scan", str(EXAMPLES / "matrix_inverse.py"), "--patch", str(patch))
    assert code == 1
    text = patch.read_text()
    assert text.startswith("--- a/examples/matrix_inverse.py\n+++ b/examples/matrix_inverse.py\n")
    assert "+        with torch.autocast(" in text
    assert "patch written to" in err


def test_no_patch_for_a_real_bug(tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    code, _, err = invoke("scan", str(FIXTURES / "fx_real_nan.py"), "--patch", str(patch))
    assert code == 1
    assert not patch.exists()
    assert "no patch to write" in err


def test_select_and_ignore() -> None:
    path = str(EXAMPLES / "matrix_inverse.py")
    assert invoke("scan", path, "--ignore", "NH101")[0] == 0
    assert invoke("scan", path, "--select", "NH2")[0] == 0
    assert invoke("scan", path, "--select", "NH1")[0] == 1


def test_config_file_overrides_defaults_and_cli_overrides_file(tmp_path: Path) -> None:
    config = tmp_path / "nh.yaml"
    config.write_text("ignore: [NH101]\n")
    path = str(EXAMPLES / "matrix_inverse.py")
    assert invoke("scan", path, "--config", str(config))[0] == 0
    assert invoke("scan", path, "--config", str(config), "--ignore", "NH9")[0] == 1


def _user_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(body)
    return str(path)


MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Linear(4, 2)

def sample_batch():
    return torch.ones(3, 4)
"""


def test_a_missing_model_file_is_said_before_a_scan_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan process imports torch (1.5 s of CPU) before the loader would find the file absent."""
    import nan_hunter.process.isolation as isolation

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a scan process started")

    monkeypatch.setattr(isolation, "run_isolated", no_process)
    absent = tmp_path / "absent.py"
    code, _, err = invoke("scan", str(absent))
    assert (code, err) == (2, f"nan-hunter: error: model file not found: {absent}\n")


@pytest.mark.parametrize(
    ("body", "args", "fragment"),
    [
        (None, ("missing.py",), "model file not found: missing.py"),
        ("def build_model(:\n", (), "syntax error in"),
        ("import torch\ndef sample_batch():\n    return torch.ones(1)\n", (), "no build_model()"),
        ("def build_model():\n    return 3\ndef sample_batch():\n    return 1\n", (),
         "must return a torch.nn.Module, got int"),
        (MODEL.replace("torch.ones(3, 4)", "torch.ones(3, 5)"), (),
         "the model raised RuntimeError during forward"),
        (MODEL.replace("return nn.Linear(4, 2)", "raise ValueError('boom')"), (),
         "ValueError while calling build_model(): boom"),
        (MODEL, ("--model-fn", "nope"), "no nope()"),
        (MODEL, ("--weights", "absent.pt"), "weights file not found: absent.pt"),
        (MODEL, ("--config", "absent.yaml"), "cannot read config file absent.yaml"),
    ],
    ids=["missing", "syntax", "no-build", "not-module", "shape", "raises", "renamed", "weights",
         "config"],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, body: str | None, args: tuple[str, ...], fragment: str
) -> None:
    target = args[0] if body is None else _user_file(tmp_path, body)
    extra = args[1:] if body is None else args
    code, out, err = invoke("scan", target, *extra)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nan-hunter: error: ")
    assert fragment in lines[0]


def test_user_error_names_the_users_frame() -> None:
    path = FIXTURES / "fx_user_error.py"
    code, _, err = invoke("scan", str(path))
    assert code == 2
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith("# <- raises"))
    assert f"{path}:{line}" in err
    assert "ValueError" in err and "boom from user code" in err


def test_unknown_config_key_names_it(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("underflow_shar: 0.1\n")
    code, _, err = invoke("scan", str(EXAMPLES / "clean_mlp.py"), "--config", str(config))
    assert code == 2
    assert "unknown key 'underflow_shar'" in err


def test_usage_error_exit_2() -> None:
    code, _, _ = invoke("scan", str(EXAMPLES / "clean_mlp.py"), "--dtype", "float8")
    assert code == 2


def test_rules_and_explain() -> None:
    code, out, _ = invoke("rules")
    assert code == 0
    codes = [line.split()[0] for line in out.splitlines()]
    assert codes == sorted(codes) and {"NH001", "NH101", "NH102", "NH201", "NH900"} <= set(codes)
    code, out, _ = invoke("explain", "nh101")
    assert code == 0
    for section in ("What", "Why", "Example", "Fix"):
        assert section in out
    code, _, err = invoke("explain", "NH999")
    assert code == 2 and "unknown rule code 'NH999'" in err


def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = invoke("scan", str(EXAMPLES / "clean_mlp.py"), "--device", "cuda")
    assert code == 2
    assert "CUDA is not available" in err


def test_every_scan_flag_goes_to_exactly_one_place() -> None:
    """``scan``'s flags are split once (``ScanCommand.partition``): settings overrides, the scan
    process's job, the output; a new flag without a destination is refused, not dropped."""
    import dataclasses
    import inspect

    from nan_hunter.cli.commands import scan
    from nan_hunter.cli.scan_command import JOB_FLAGS, SETTING_FLAGS, Output, ScanCommand
    from nan_hunter.project.config import Settings

    flags = {
        name: (["model.py"] if name == "paths" else p.default)
        for name, p in inspect.signature(scan).parameters.items()
    }
    command = ScanCommand.partition(flags)
    settings_keys = {f.name for f in dataclasses.fields(Settings)}
    assert set(command.overrides) <= settings_keys
    assert set(command.job) == set(JOB_FLAGS)
    places = [set(SETTING_FLAGS), set(JOB_FLAGS), {f.name for f in dataclasses.fields(Output)},
              {"paths", "config", "timeout", "debug"}]
    assert sum(len(p) for p in places) == len(set().union(*places)) == len(flags)
    with pytest.raises(TypeError, match="no destination: colour"):
        ScanCommand.partition({**flags, "colour": True})
