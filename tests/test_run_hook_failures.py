"""``nan-hunter run``: a failure of nan-hunter's own code in a hook it attached to the script
is said to be ours (one line, exit 2), never shown as the script's error at its own line, never
swallowed by the script's ``except Exception``, and it leaves the script's process as it was.

The bug is planted by the script itself (it runs in the process the watch is attached to).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app

runner = CliRunner()

_SCRIPT = """
import sys
import torch
import nan_hunter.training.attach as attach

PLANT, AT_CALL, NAN_AT = {plant!r}, {at_call}, {nan_at}
calls = []

def planted(original):
    def bug(*args, **kwargs):
        calls.append(1)
        if len(calls) == AT_CALL:
            raise ValueError("a bug of ours")
        return original(*args, **kwargs)
    return bug

if PLANT == "step check":
    attach.step_verdict = planted(attach.step_verdict)
elif PLANT == "ranks' agreement":
    attach.ScriptWatch._agree = planted(attach.ScriptWatch._agree)
elif PLANT == "forward pre-hook":
    now = planted(attach.StepPrecision.now)
    attach.StepPrecision = type("Broken", (), {{"now": staticmethod(now)}})

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(5):
        try:
            x = torch.randn(8, 4)
            if step + 1 == NAN_AT:
                x[0, 0] = float("nan")
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        except Exception as exc:  # a training loop that carries on past a bad batch
            print(f"caught {{type(exc).__name__}}", flush=True)
    print("done", flush=True)
finally:
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    print(f"forward hooks left: {{len(hooks)}}", flush=True)
    print(f"optimizer hooks left: {{len(_global_optimizer_pre_hooks)}}", flush=True)
    print(f"backward restored: {{not hasattr(torch.autograd.backward, '__wrapped__')}}",
          flush=True)
    print(f"grads kept: {{all(p.grad is not None for p in model.parameters())}}", flush=True)
"""


def _script(tmp_path: Path, plant: str, at_call: int = 1, nan_at: int = -1) -> Path:
    """A script of 5 steps whose ``plant`` (the step check's verdict, the forward pre-hook's
    precision) raises at its ``at_call``-th call; its batch holds a NaN at step ``nan_at``."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(_SCRIPT.format(plant=plant, at_call=at_call, nan_at=nan_at)))
    return path


@pytest.mark.parametrize(
    ("plant", "hook", "step"),
    [("step check", "the step check", 3), ("forward pre-hook", "the module forward pre-hook", 2)],
)  # fmt: skip
def test_a_bug_in_a_hook_of_ours_is_one_line_and_exit_2(
    tmp_path: Path, plant: str, hook: str, step: int
) -> None:
    script = _script(tmp_path, plant, at_call=step)
    report = tmp_path / "report.json"
    result = runner.invoke(app, ["run", "--format", "json", "-o", str(report), str(script)])
    out, err = result.stdout, result.stderr
    assert result.exit_code == 2, err
    assert "caught" not in out and "done" not in out  # not the script's to catch
    assert out.count("forward hooks left") == 1
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("nan-hunter: ")]
    assert lines[0] == (
        f"nan-hunter: internal error in {hook} at training step {step}: ValueError: a bug of "
        "ours; nan-hunter detached and stopped the script (a bug of nan-hunter's, not of the "
        "script: NAN_HUNTER_DEBUG=1 shows its traceback)"
    )
    assert lines[1:] == [
        f"nan-hunter: {step - 1} optimizer step{'s' * (step != 2)} checked before nan-hunter "
        "failed; later steps were not checked",
        f"nan-hunter: no report written to {report}: the run was not checked to its end",
    ]
    assert not report.exists()  # no clean report over steps never checked
    # the script's finally blocks run after the watch left: nothing of ours is left behind
    assert "forward hooks left: 0" in out
    assert "optimizer hooks left: 0" in out
    assert "backward restored: True" in out


def test_the_gradients_set_aside_for_a_skipped_update_are_put_back(tmp_path: Path) -> None:
    """Step 3's NaN gradients are set aside so its update is skipped; our failure right after
    (in the ranks' agreement) leaves them where the script expects them."""
    script = _script(tmp_path, "ranks' agreement", at_call=3, nan_at=3)
    result = runner.invoke(app, ["run", "--no-verify", str(script)])
    assert result.exit_code == 2, result.stderr
    assert "internal error in the step check at training step 3" in result.stderr
    assert "grads kept: True" in result.stdout


def test_a_problem_found_before_our_failure_keeps_exit_1(tmp_path: Path) -> None:
    script = _script(tmp_path, "step check", at_call=4, nan_at=2)
    result = runner.invoke(app, ["run", "--no-verify", "--no-save-repro", "--on-problem",
                                 "continue", str(script)])
    assert result.exit_code == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("nan-hunter: ")]
    assert lines[0].startswith("nan-hunter: training step 2: the loss is nan; NH001")
    assert lines[1].startswith("nan-hunter: internal error in the step check at training step 4")


def test_debug_shows_the_traceback_of_our_failure(tmp_path: Path) -> None:
    script = _script(tmp_path, "step check")
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "run", str(script)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NAN_HUNTER_DEBUG": "1"},
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "ValueError: a bug of ours" in done.stderr
    assert "nan_hunter/training/attach.py" in done.stderr  # our frames, not hidden
