"""The terminal: colour choice (--color, NO_COLOR, FORCE_COLOR), layout to the terminal's width
(a golden report at 80 columns), ``rules`` at 80 columns, the progress display and its events,
and SARIF locations relative to the repository root."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app, terminal
from nan_hunter.cli.terminal import ColorChoice, report_width, wants_color
from nan_hunter.core.progress import listening
from nan_hunter.project.config import load_settings
from nan_hunter.report import render
from nan_hunter.report.text import MIN_WIDTH, render_rules
from nan_hunter.rules import all_rules
from tests.conftest import EXAMPLES, FIXTURES, GOLDEN, ROOT, fixture_options

runner = CliRunner()
WIDTH80 = [EXAMPLES / "matrix_inverse.py", FIXTURES / "fx_grad_underflow.py"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100", **(env or {})})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("choice", "env", "tty", "expected"),
    [
        (ColorChoice.auto, {}, True, True),
        (ColorChoice.auto, {}, False, False),
        (ColorChoice.auto, {"NO_COLOR": "1"}, True, False),
        (ColorChoice.auto, {"NO_COLOR": ""}, True, True),  # set but empty: no effect
        (ColorChoice.auto, {"FORCE_COLOR": "1"}, False, True),
        (ColorChoice.auto, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False, False),
        (ColorChoice.always, {"NO_COLOR": "1"}, False, True),
        (ColorChoice.never, {"FORCE_COLOR": "1"}, True, False),
    ],
)
def test_wants_color(choice: ColorChoice, env: dict[str, str], tty: bool, expected: bool) -> None:
    stream = _Tty() if tty else io.StringIO()
    assert wants_color(choice, stream, env) is expected


def test_color_through_the_cli() -> None:
    path = str(EXAMPLES / "clean_mlp.py")
    assert "\x1b[" not in invoke("scan", path)[1]  # piped: no colour
    assert "\x1b[" in invoke("scan", path, "--color", "always")[1]
    assert "\x1b[" in invoke("scan", path, env={"FORCE_COLOR": "1"})[1]
    assert "\x1b[" not in invoke("scan", path, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})[1]
    assert "\x1b[" not in invoke("scan", path, "--no-color", env={"FORCE_COLOR": "1"})[1]
    assert "\x1b[" not in invoke("scan", path, "--color", "never", env={"FORCE_COLOR": "1"})[1]


def test_width_is_the_terminal_s_at_least_80(monkeypatch: pytest.MonkeyPatch) -> None:
    assert report_width(io.StringIO()) is None  # not a terminal: lines unwrapped
    monkeypatch.setenv("COLUMNS", "120")
    assert report_width(_Tty()) == 120
    monkeypatch.setenv("COLUMNS", "60")
    assert report_width(_Tty()) == 80
    assert terminal.MIN_WIDTH == MIN_WIDTH == 80


@pytest.mark.parametrize("path", WIDTH80, ids=lambda p: p.stem)
def test_golden_report_at_80_columns(path: Path, update_golden: bool) -> None:
    settings = load_settings(overrides=fixture_options(path))
    report = dataclasses.replace(scan_file(str(path), settings), seconds=0.0)
    rendered = render(report, "text", width=80)
    golden = GOLDEN / "width80" / f"{path.stem}.txt"
    if update_golden or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
        if not update_golden:
            pytest.fail(f"{golden} did not exist; written now, check it in")
    assert rendered == golden.read_text(encoding="utf-8")
    unwrapped = render(report, "text").splitlines()
    diff = {line for line in unwrapped if line[:1] in "+- @"}
    for line in rendered.splitlines():
        assert line == line.rstrip() or line in diff, f"trailing blanks: {line!r}"
        assert len(line) <= 80 or line in diff, f"over 80 columns: {line!r}"
    # the same words in the same order: wrapping only moved line breaks
    assert rendered.split() == render(report, "text").split()


def test_rules_at_80_columns_and_unwrapped() -> None:
    wrapped = render_rules(all_rules(), width=80)
    assert max(len(line) for line in wrapped.splitlines()) <= 80
    assert wrapped.split() == render_rules(all_rules()).split()
    first, second = wrapped.splitlines()[:2]
    assert first == "NH001  error    bad-input"
    assert second.startswith("       The input batch")
    wide = render_rules(all_rules(), width=160).splitlines()
    assert len(wide) == len(all_rules())
    assert invoke("rules")[1] == render_rules(all_rules())  # piped: one line per rule


def test_scan_announces_its_passes() -> None:
    heard: list[str] = []
    with listening(heard.append):
        scan_file(str(EXAMPLES / "matrix_inverse.py"))
    assert heard == [
        "float16 autocast pass + backward",
        "FP32 reference pass",
        "verifying a fix: re-scan of a patched copy",  # scan_file verifies the fix
        "float16 autocast pass + backward",
        "unscaled backward for the loss-scale window",  # the fixed model's backward runs
        "backward at GradScaler's backed-off 2**10",
        "FP32 loss of the model",  # the fixed model's FP32 loss: what the fix changes
    ]


def test_progress_display_only_on_a_terminal_and_not_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", _Tty())
    with terminal.progress_display(enabled=True, files=2) as shown:
        assert shown._progress is not None
        shown.file("a.py")
        shown.step("FP32 reference pass")
        task = shown._progress.tasks[0]
        assert task.description == "a.py: FP32 reference pass"
        shown.file_done()
        assert task.completed == 1 and task.total == 2
    with terminal.progress_display(enabled=False) as shown:
        assert shown._progress is None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with terminal.progress_display(enabled=True) as shown:
        assert shown._progress is None


def test_progress_is_silent_when_stderr_is_a_pipe() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", str(EXAMPLES / "clean_mlp.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_sarif_uris_are_repository_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code scanning maps ``%SRCROOT%``-relative URIs onto the repository: a file in the repo is
    named relative to its root even when the scan runs from a subfolder; a file outside it gets
    an absolute ``file:`` URI."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "models").mkdir()
    (repo / "ci").mkdir()
    shutil.copy(EXAMPLES / "matrix_inverse.py", repo / "models" / "inverse model.py")
    outside = tmp_path / "elsewhere" / "model.py"
    outside.parent.mkdir()
    shutil.copy(EXAMPLES / "matrix_inverse.py", outside)
    monkeypatch.chdir(repo / "ci")
    for path, uri, base in (
        (repo / "models" / "inverse model.py", "models/inverse%20model.py", "%SRCROOT%"),
        (outside, outside.as_uri(), None),
    ):
        code, out, _ = invoke("scan", str(path), "--format", "sarif", "--no-verify")
        assert code == 1
        (result,) = json.loads(out)["runs"][0]["results"]
        location = result["locations"][0]["physicalLocation"]["artifactLocation"]
        assert location.get("uriBaseId") == base
        assert location["uri"] == uri


def test_help_is_plain_and_shows_defaults() -> None:
    code, out, _ = invoke("scan", "--help", env={"COLUMNS": "80"})
    assert code == 0
    assert "╭" not in out and "│" not in out  # click's plain layout, not boxes
    flat = " ".join(out.split())
    assert "(a plain FP32 run). [default: float16, unless configured]" in flat
    assert "[default: backward, unless configured]" in flat
    assert "--color [auto|always|never]" in flat or "--color <auto|always|never>" in flat
    assert "[default: auto]" in flat
    assert max(len(line) for line in out.splitlines()) <= 80


def test_training_steps_are_announced() -> None:
    from nan_hunter.project.config import load_settings
    from nan_hunter.project.loader import load_target
    from nan_hunter.watch import run_steps

    heard: list[str] = []
    with listening(heard.append):
        run_steps(load_target(str(EXAMPLES / "clean_mlp.py")), load_settings(), 2)
    assert heard[:2] == ["training step 1/2", "training step 2/2"]
    assert heard[2:] == ["float16 autocast pass + backward"]  # the scan of the final weights


def test_cli_progress_shows_passes_and_fix_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    """With stderr taken for a terminal, the display hears every pass and each re-scan that
    verifies a fix, per file."""
    shown: list[str] = []
    monkeypatch.setattr(terminal, "_isatty", lambda stream: True)
    real_step = terminal.ProgressDisplay.step

    def step(self: terminal.ProgressDisplay, what: str) -> None:
        if self._progress is not None:  # a display on screen, not the no-op one
            shown.append(what)
        real_step(self, what)

    monkeypatch.setattr(terminal.ProgressDisplay, "step", step)
    code, _, _ = invoke("scan", str(EXAMPLES / "matrix_inverse.py"))
    assert code == 1
    assert shown == [
        "loading",
        "float16 autocast pass + backward",
        "FP32 reference pass",
        "verifying a fix: re-scan of a patched copy",
        # the fixed copy's gradients overflow at GradScaler's 2**16: its back-off is simulated
        "float16 autocast pass + backward",
        "unscaled backward for the loss-scale window",
        "backward at GradScaler's backed-off 2**10",
        "FP32 loss of the model",
    ]
    shown.clear()
    assert invoke("scan", str(EXAMPLES / "matrix_inverse.py"), "--quiet")[0] == 1
    assert shown == []


def _hooks() -> dict[str, dict]:
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    return {hook["id"]: hook for hook in hooks}


def test_pre_commit_hooks_are_one_in_its_own_env_and_one_in_yours() -> None:
    hooks = _hooks()
    assert {h: hooks[h]["language"] for h in hooks} == {
        "nan-hunter": "python", "nan-hunter-system": "system",
    }
    for hook in hooks.values():
        assert hook["entry"] == "nan-hunter scan --quiet"
        assert hook["pass_filenames"] is False and hook["args"] == ["."]
    header = (ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    assert "additional_dependencies: [torch]" not in header  # unpinned: a multi-GB CUDA wheel
    assert 'additional_dependencies: ["torch==' in header


@pytest.mark.parametrize(
    ("example", "expected"), [("clean_mlp.py", 0), ("matrix_inverse.py", 1), (None, 2)]
)
def test_the_hook_entry_on_a_sample_repository(
    example: str | None, expected: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook's entry and default args, run from a repository's root as pre-commit runs it:
    a clean model passes, a failing one blocks, a repository without a model file is an error,
    and nothing but errors reaches the terminal of a passing run."""
    import shlex

    hook = _hooks()["nan-hunter-system"]
    (tmp_path / "notes.py").write_text("x = 1\n", encoding="utf-8")
    if example is not None:
        shutil.copy(EXAMPLES / example, tmp_path / "models.py")
    monkeypatch.chdir(tmp_path)
    program, *args = shlex.split(hook["entry"])
    assert program == "nan-hunter"
    code, out, err = invoke(*args, *hook["args"])
    assert code == expected, (out, err)
    if expected == 0:
        assert err == ""
    if expected == 2:
        assert "defines build_model()" in err
