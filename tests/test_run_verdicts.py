"""``nan-hunter run`` as the guardian of a training run: a patch that fixes the run it watched,
the verified fix first, one verdict on the cause of a problem step, a model returning a plain
dataclass, and two optimizers sharing one GradScaler.

Each test runs a real training script (``tests/run_scripts/``) in a process of its own: slow.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import ROOT, marker_line

pytestmark = pytest.mark.slow

SCRIPTS = ROOT / "tests" / "run_scripts"
VERDICT = "tests/run_scripts/verdict_train.py"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["run", "--no-save-repro", *args], env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nan-hunter: ")]


def _patched_copy(tmp_path: Path, script: str, patch: Path) -> Path:
    """The script copied under ``tmp_path`` at the same relative path, the patch applied."""
    copy = tmp_path / "project"
    target = copy / script
    target.parent.mkdir(parents=True)
    shutil.copy(ROOT / script, target)
    done = subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=copy,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    return copy


def _trains(copy: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script, *args], cwd=copy, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("policy", ["cuda", "cpu"])
def test_a_patch_from_run_lets_the_watched_script_train_past_its_bad_step(
    tmp_path: Path, policy: str
) -> None:
    """Before, the patch named ``device_type="cuda"``: verified under the emulation (which maps
    "cuda" to the CPU), it left the script's own CPU autocast on, and step 12 broke again."""
    script = "tests/run_scripts/pairs_train.py"
    patch = tmp_path / "fix.patch"
    code, _, err = invoke("--policy", policy, "--patch", str(patch), script, "--steps", "30")
    assert code == 1
    assert ours(err)[0].startswith("nan-hunter: training step 12: the loss is nan; NH102")
    copy = _patched_copy(tmp_path, script, patch)
    watched = subprocess.run(  # watched again, policy cuda emulated on the CPU
        [sys.executable, "-m", "nan_hunter", "run", "--no-verify", script, "--steps", "30"],
        cwd=copy, capture_output=True, text=True, timeout=300,
    )
    assert ours(watched.stderr) == [
        "nan-hunter: 30 optimizer steps checked, no problem; the script exited with code 0"
    ]
    assert watched.returncode == 0, watched.stderr
    plain = _trains(copy, script, "--steps", "30")  # the script's own CPU autocast, unwatched
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == ["weights finite: True", "done ['--steps', '30']"]
    text = patch.read_text()
    assert "+        with torch.autocast(device_type=q.device.type, enabled=False):" in text


def test_the_verified_fix_is_shown_first_and_is_what_patch_writes(tmp_path: Path) -> None:
    """The FP32 region around the inverse and the matmul is refuted by its re-scan (NH401 in
    the FP16 ``dtd``); the region taking in ``dtd = d.t() @ d`` is verified. Before, the
    refuted one was the fix and the verified one came after it as ``or``; now the verified one
    is the fix and the refuted one, no safer, is left out (``fixes.cost.choose``)."""
    script = "tests/run_scripts/ridge_train.py"
    report, patch = tmp_path / "report.json", tmp_path / "fix.patch"
    code, _, _ = invoke("--format", "json", "-o", str(report), "--patch", str(patch), script)
    assert code == 1
    fix = json.loads(report.read_text())["findings"][0]["fix"]
    assert fix["verified"] is True
    assert fix["title"].endswith("with the statements producing its inputs")
    assert all(alt["verified"] for alt in fix["alternatives"])
    text = patch.read_text()
    assert "+            dtd = d.t() @ d  # producer" in text
    copy = _patched_copy(tmp_path, script, patch)
    plain = _trains(copy, script, "--steps", "5")
    assert plain.returncode == 0 and plain.stdout.strip() == "done", plain.stderr


VERDICTS = [
    ("overflow", "precision_problem",
     "the re-run in float16 reproduces it at NH101 torch.nn.functional.linear; in FP32 the same "
     "op is finite (|x| <= 2.39e+05)",
     "the loss is nan; NH101 torch.nn.functional.linear in Net.inp at "
     f"{VERDICT}:{marker_line(SCRIPTS / 'verdict_train.py', '# culprit')}; precision problem"),
    ("fp32-nan", "real_bug",
     "the re-run in float32, the precision the step ran in, is non-finite at NH301 torch.log",
     f"the loss is nan; NH301 torch.log in Net at "
     f"{VERDICT}:{marker_line(SCRIPTS / 'verdict_train.py', '# log-culprit')}; real bug"),
    ("one-off", "not_reproducible",
     "the outputs of Net were not finite in the step; re-run from its inputs and weights "
     "(twice, the second from the random number generators' state of the step's forward), "
     "they are finite (no error: nothing)",
     "the loss is nan; not reproducible: the outputs of Net were not finite in the step; re-run "
     "from its inputs and weights (twice, the second from the random number generators' state "
     "of the step's forward), they are finite (no error: nothing); state the re-run cannot "
     "restore: Net.calls changed from 4 to 5 (a module that changes at each call)"),
    ("grad-hook", "outside_forward",
     "the outputs of Net were finite in the step and in its re-run (no error: nothing); the "
     "gradient reaching the outputs was finite and so is the model's backward re-run from it, "
     "but the parameters' gradients were not: they changed after the model's backward (a "
     "gradient hook, another rank's all-reduce)",
     "non-finite gradient (1 of the optimizer's parameters); outside the model's forward: the "
     "outputs of Net were finite in the step and in its re-run (no error: nothing); the "
     "gradient reaching the outputs was finite and so is the model's backward re-run from it, "
     "but the parameters' gradients were not: they changed after the model's backward (a "
     "gradient hook, another rank's all-reduce)"),
]


@pytest.mark.parametrize(("case", "verdict", "evidence", "line"), VERDICTS,
                         ids=[v[0] for v in VERDICTS])
def test_one_verdict_on_the_cause_in_the_line_json_and_sarif(
    tmp_path: Path, case: str, verdict: str, evidence: str, line: str
) -> None:
    """Before, every re-run that found no error said "the non-finite values came from outside
    its forward", the one-off fault inside the forward too, and there was no verdict field."""
    report = tmp_path / "report.json"
    code, _, err = invoke("--no-verify", "--format", "json", "-o", str(report), VERDICT,
                          "--case", case)
    assert code == 1
    assert ours(err)[0] == f"nan-hunter: training step 4: {line} (report {report})"
    training = json.loads(report.read_text())["training"]
    assert (training["problem_step"], training["verdict"]) == (4, verdict)
    assert training["evidence"][0] == evidence
    if case == "one-off":
        assert training["evidence"][1:] == [
            "state the re-run cannot restore: Net.calls changed from 4 to 5 (a module that "
            "changes at each call)",
            "a transient fault, a non-deterministic kernel, or state the re-run does not restore",
        ]


def test_sarif_carries_the_verdict_and_its_evidence(tmp_path: Path) -> None:
    report = tmp_path / "report.sarif"
    code, _, _ = invoke("--no-verify", "--format", "sarif", "-o", str(report), VERDICT,
                        "--case", "grad-hook")
    assert code == 1
    training = json.loads(report.read_text())["runs"][0]["properties"]["training"]
    assert training["verdict"] == "outside_forward"
    assert training["evidence"][0].startswith("the outputs of Net were finite in the step")


def test_a_model_returning_a_plain_dataclass_is_a_model_call() -> None:
    """Before: "not re-run: no call of a model with trainable parameters was seen"."""
    code, _, err = invoke("--no-verify", VERDICT, "--case", "overflow", "--dataclass")
    assert code == 1
    assert ours(err)[0] == (
        "nan-hunter: training step 4: the loss is nan; NH101 torch.nn.functional.linear in "
        f"Net.inp at {VERDICT}:{marker_line(SCRIPTS / 'verdict_train.py', '# culprit')}; "
        "precision problem (report on stderr)"
    )


def test_two_optimizers_sharing_a_gradscaler_count_and_skip_per_optimizer() -> None:
    """Iterations 10, 11, 12 skip one optimizer each (D, G, D) while the other updates. Before,
    the three back-offs of the scale were "3 skips in a row" and the run stopped at "step 12"
    (an iteration count); the real problem is iteration 30's NaN batch, optimizer step 59."""
    code, _, err = invoke("--no-verify", "tests/run_scripts/gan_train.py")
    assert code == 1
    # the losses multiplied by 1e30 at iterations 10-12 (optimizer steps 19, 22, 23) are loss
    # spikes: said once, counted in the summary; they are no problem step. Each optimizer has
    # its own running median and warm-up (10 losses): the discriminator's 10th loss (step 19)
    # is still in its warm-up, the generator's 11th (step 22) and the discriminator's 12th
    # (step 23) are judged
    assert ours(err) == [
        "nan-hunter: warning: training step 22: optimizer 2 (Adam): the loss 6.41e+29 is "
        "1.01e+30x its running median 0.637",
        "nan-hunter: training step 59: the loss is nan; NH001 input in Sequential; real bug "
        "(report on stderr)",
        "nan-hunter: 58 optimizer steps checked, 1 problem step (the first at step 59), 2 loss "
        "spikes (steps 22 to 23; the first was said); the script was stopped (--on-problem "
        "stop)",
    ]
