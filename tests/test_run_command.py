"""``nan-hunter run``: an unmodified training script, its first bad step re-run and reported.

The script's own process is the subject of some tests (exit codes, tracebacks, signals): those
start ``nan-hunter`` as a real process; the others go through typer's CliRunner (the script
still runs in a process of its own; its output is copied into the runner's streams).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import CLI_FROM_A_TERMINAL, ROOT, marker_line

SCRIPTS = ROOT / "tests" / "run_scripts"
PAIRS = SCRIPTS / "pairs_train.py"
PAIRS_REL = "tests/run_scripts/pairs_train.py"
CULPRIT = marker_line(PAIRS, "# culprit")
NH = [sys.executable, "-m", "nan_hunter"]
SCHEMA = ROOT / "nan_hunter" / "report" / "report.schema.json"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["run", *args], env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nan-hunter: ")]


def test_names_the_step_rule_op_module_and_line_of_a_gradscaler_loop(tmp_path: Path) -> None:
    report, patch = tmp_path / "report.json", tmp_path / "fix.patch"
    bundle = tmp_path / "bundle"
    done = subprocess.run(
        [*NH, "run", "--format", "json", "-o", str(report), "--patch", str(patch),
         "--save-repro", str(bundle), PAIRS_REL, "--steps", "30"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "done" not in done.stdout  # stopped at the bad step
    assert ours(done.stderr) == [
        "nan-hunter: training step 12: the loss is nan; NH102 Tensor.__matmul__ in "
        f"PairModel.pairs at {PAIRS_REL}:{CULPRIT}; precision problem (report {report})",
        f"nan-hunter: reproduction saved to {bundle} (33 KB): nan-hunter scan "
        f"{bundle}/model.py",
        f"nan-hunter: patch written to {patch}",
        "nan-hunter: 11 optimizer steps checked, 1 problem step (the first at step 12); the "
        "script was stopped (--on-problem stop)",
    ]
    assert "error[NH102]" in done.stderr  # the text report on stderr, the JSON in the file
    data = json.loads(report.read_text())
    assert data["target"]["notes"] == [
        "training step 12: the loss is nan; 11 optimizer steps checked before it; re-run from "
        "the step's own inputs and weights",
        "verdict: precision problem: the re-run in float16 reproduces it at NH102 "
        "Tensor.__matmul__; in FP32 the same op is finite (|x| <= 8.86e+04)",
    ]
    repro = data["training"].pop("repro")
    assert (repro["path"], repro["written"]) == (str(bundle), True)
    assert data["training"] == {
        "steps_checked": 11, "problem_step": 12, "losses_checked": 0,
        "verdict": "precision_problem",
        "evidence": ["the re-run in float16 reproduces it at NH102 Tensor.__matmul__; in FP32 the "
                     "same op is finite (|x| <= 8.86e+04)"],
    }
    first = data["findings"][0]
    assert (first["code"], first["op"], first["module"]) == ("NH102", "Tensor.__matmul__", "pairs")
    assert first["location"]["line"] == CULPRIT
    assert first["fix"]["verified"] is True
    text = patch.read_text()
    assert "--- a/tests/run_scripts/pairs_train.py" in text
    # the autocast the script runs (CPU here), named by the tensor: the same line on a GPU
    assert "+        with torch.autocast(device_type=q.device.type, enabled=False):" in text


def test_inputs_come_from_the_real_call_with_keyword_arguments() -> None:
    code, _, err = invoke("--no-verify", PAIRS_REL, "--kwargs")
    assert code == 1, err
    assert ours(err)[0].startswith(
        "nan-hunter: training step 12: the loss is nan; NH102 Tensor.__matmul__ in PairModel.pairs"
    )


@pytest.mark.parametrize("form", ["function", "imported"])
def test_the_loss_is_seen_when_the_script_calls_torch_autograd_backward(form: str) -> None:
    code, _, err = invoke("--no-verify", PAIRS_REL, "--backward", form)
    assert code == 1, err
    assert ours(err)[0].startswith(
        "nan-hunter: training step 12: the loss is nan; NH102 Tensor.__matmul__ in PairModel.pairs"
    )


def test_max_steps_ends_a_clean_run_with_exit_0_and_says_how_many_steps() -> None:
    code, out, err = invoke("--max-steps", "5", PAIRS_REL, "--steps", "30", "--exit", "3")
    assert code == 0, err
    assert "done" not in out
    assert ours(err) == [
        "nan-hunter: 5 optimizer steps checked, no problem; --max-steps 5 reached"
    ]


def test_a_clean_max_steps_run_writes_a_json_report_with_the_steps_checked(
    tmp_path: Path,
) -> None:
    report, patch = tmp_path / "out.json", tmp_path / "fix.patch"
    code, _, err = invoke(
        "--max-steps", "5", "--format", "json", "-o", str(report), "--patch", str(patch),
        PAIRS_REL, "--steps", "30",
    )
    assert code == 0, err
    assert ours(err) == [
        "nan-hunter: 5 optimizer steps checked, no problem; --max-steps 5 reached",
        f"nan-hunter: report written to {report}",
        "nan-hunter: no patch to write: no finding has a fix to apply",  # as scan says it
    ]
    assert not patch.exists()
    data = json.loads(report.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    assert (data["status"], data["findings"], data["summary"]["errors"]) == ("clean", [], 0)
    assert data["training"] == {"steps_checked": 5, "problem_step": None, "losses_checked": 0,
                                "verdict": None, "evidence": []}
    assert data["target"]["file"] == PAIRS_REL
    assert data["target"]["notes"][0] == (
        "5 optimizer steps checked, no problem; --max-steps 5 reached"
    )


def test_a_clean_script_end_writes_a_sarif_report_without_results(tmp_path: Path) -> None:
    report = tmp_path / "report.sarif"
    code, _, err = invoke(
        "--format", "sarif", "-o", str(report), PAIRS_REL, "--steps", "3", "--exit", "3"
    )
    assert code == 3, err
    run = json.loads(report.read_text())["runs"][0]
    assert run["results"] == []
    assert run["properties"]["training"] == {"steps_checked": 3, "problem_step": None,
                                                   "losses_checked": 0, "verdict": None,
                                                   "evidence": []}


def test_script_exit_code_and_argv_pass_through_when_nothing_is_found() -> None:
    code, out, err = invoke(PAIRS_REL, "--steps", "3", "--exit", "3")
    assert code == 3, err
    assert "done ['--steps', '3', '--exit', '3']" in out
    assert ours(err) == [
        "nan-hunter: 3 optimizer steps checked, no problem; the script exited with code 3"
    ]


def test_module_with_double_dash_arguments(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(PAIRS.read_text())
    result = subprocess.run(
        [*NH, "run", "-m", "mypkg.train", "--", "--steps", "2", "--exit", "4"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 4, result.stderr
    assert "done ['--steps', '2', '--exit', '4']" in result.stdout


def test_stop_skips_the_bad_update_without_a_gradscaler() -> None:
    """FP32, no GradScaler: a NaN batch at step 3. Without nan-hunter the update writes NaN
    into the weights (the script's ``finally`` would save them); ``run`` skips it."""
    plain = subprocess.run(
        [sys.executable, PAIRS_REL, "--fp32", "--nan-at", "3", "--steps", "4"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert "weights finite: False" in plain.stdout
    code, out, err = invoke("--no-verify", PAIRS_REL, "--fp32", "--nan-at", "3", "--steps", "4")
    assert code == 1
    assert "weights finite: True" in out and "done" not in out
    assert ours(err)[0].startswith("nan-hunter: training step 3: the loss is nan; NH001 input")


def test_continue_skips_the_bad_update_and_runs_to_the_end() -> None:
    code, out, err = invoke(
        "--no-verify", "--on-problem", "continue", PAIRS_REL, "--fp32", "--nan-at", "3",
        "--steps", "6",
    )
    assert code == 1
    assert "weights finite: True" in out and "done" in out
    assert ours(err)[-1] == (
        "nan-hunter: 6 optimizer steps checked, 1 problem step (the first at step 3); the "
        "script exited with code 0"
    )


def test_raise_raises_training_problem_inside_the_script() -> None:
    code, out, _ = invoke(
        "--no-verify", "--on-problem", "raise", PAIRS_REL, "--fp32", "--nan-at", "2", "--catch"
    )
    assert "caught TrainingProblem" in out
    assert code == 1


def test_the_scripts_exception_keeps_its_traceback_and_exit_code() -> None:
    """The traceback is the one ``python script.py`` prints: no nan-hunter or runpy frames.
    (torch's own ``Module._call_impl`` frames differ: with global hooks it calls ``inner()``.)"""
    args = [PAIRS_REL, "--fail-at", "3"]
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
    ran = subprocess.run([*NH, "run", *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert plain.returncode == ran.returncode == 1
    assert "ValueError: the scorer failed on purpose" in ran.stderr
    kept = [line for line in ran.stderr.splitlines() if not line.startswith("nan-hunter: ")]
    assert without_module_calls(kept) == without_module_calls(plain.stderr.splitlines())
    assert "nan_hunter" not in "\n".join(kept) and "runpy" not in "\n".join(kept)
    assert ran.stdout == plain.stdout


def without_module_calls(lines: list[str]) -> list[str]:
    """A traceback without the frames of torch's module.py (and their code lines)."""
    kept: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith('  File "'):
            skipping = "torch/nn/modules/module.py" in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return kept


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "run needs a script"),
        (["no_such_script.py"], "no such script: no_such_script.py"),
        (["--on-problem", "halt", PAIRS_REL], "--on-problem must be one of stop, continue, raise"),
        (["-o", PAIRS_REL, PAIRS_REL], "refusing to write the report to"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, _, err = invoke(*args)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_ends_the_script_as_without_nan_hunter(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([*CLI_FROM_A_TERMINAL, "run", str(script)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    os.killpg(child.pid, 2)
    _, err = child.communicate(timeout=60)
    assert child.returncode == -2
    assert "KeyboardInterrupt" in err and "nan_hunter" not in err.split("nan-hunter: ")[0]


@pytest.mark.slow
def test_the_command_line_process_does_not_import_torch() -> None:
    program = (
        "import sys\nfrom typer.testing import CliRunner\nfrom nan_hunter.cli import app\n"
        f"r = CliRunner().invoke(app, ['run', '{PAIRS_REL}', '--steps', '2'])\n"
        "print(r.exit_code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["0", "False"], done.stderr


def test_the_sparse_coding_example_is_named_with_a_verified_patch(tmp_path: Path) -> None:
    """``examples/train_sparse_coding.py`` scans clean; only epoch 7's first step breaks."""
    example = ROOT / "examples" / "train_sparse_coding.py"
    line = example.read_text().splitlines().index(
        "        codes = torch.matmul(dtd_inv, z)") + 1
    report, patch = tmp_path / "report.json", tmp_path / "fix.patch"
    code, out, err = invoke(
        "--format", "json", "-o", str(report), "--patch", str(patch),
        "examples/train_sparse_coding.py",
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("epoch 6: ")
    # the loss rises (11x to 39x its running median) before it goes NaN: one warning (the first
    # spike; the summary counts them all), then the step
    assert ours(err)[0] == ("nan-hunter: warning: training step 12: the loss 0.00773 is 11.3x "
                            "its running median 0.000687")
    assert ours(err)[1] == (
        "nan-hunter: training step 49: the loss is nan; NH101 torch.matmul in "
        f"SparseCodingEncoder at examples/train_sparse_coding.py:{line}; precision problem "
        f"(report {report})"
    )
    first = json.loads(report.read_text())["findings"][0]
    assert (first["code"], first["op"], first["location"]["line"]) == (
        "NH101", "torch.matmul", line
    )
    assert first["fix"]["verified"] is True and first["fix"]["applicability"] == "safe"
    assert "+            codes = torch.matmul(dtd_inv, z)" in patch.read_text()


def test_an_fp32_runs_nan_is_analysed_in_fp32_as_a_real_bug() -> None:
    """Before, the FP32 step was re-run in FP16: NH102 at the projection (whose outputs only
    overflow FP16), "a precision problem", and the ``log(0)`` merely propagated."""
    script = SCRIPTS / "fp32_log_zero.py"
    code, _, err = invoke("--no-verify", "tests/run_scripts/fp32_log_zero.py")
    assert code == 1
    assert "nan-hunter tests/run_scripts/fp32_log_zero.py: float32 on cpu" in err
    assert ours(err)[0] == (
        "nan-hunter: training step 3: the loss is inf; NH301 torch.log in LogFeatures at "
        f"tests/run_scripts/fp32_log_zero.py:{marker_line(script, '# culprit')}; real bug "
        "(report on stderr)"
    )


def test_clipping_scaled_gradients_is_one_warning_naming_the_scripts_line() -> None:
    line = marker_line(PAIRS, "# clips scaled gradients")
    code, _, err = invoke(PAIRS_REL, "--clip", "--steps", "3")
    assert code == 0
    assert ours(err) == [
        f"nan-hunter: warning: training step 2: clip_grad_norm_ was called at {PAIRS_REL}:{line} "
        "on scaled gradients (before scaler.unscale_(optimizer)): its threshold applies to "
        "gradients multiplied by the loss scale (32768); fix: scaler.unscale_(optimizer); "
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        "nan-hunter: 3 optimizer steps checked, no problem; the script exited with code 0",
    ]
