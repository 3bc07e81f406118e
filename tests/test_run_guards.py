"""``nan-hunter run`` against hostile scripts: it never writes over a file the script imported,
read or wrote, and a problem it reported is exit 1 whatever the script does after it.

The scripts are written into ``tmp_path``; each test starts the real CLI process (the script's
exit path, signals and files are the subject), hence the ``slow`` marker. The unit tests of the
pieces (``ScriptFiles``, ``refuse_overwrite``) run in the default suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nan_hunter.core.safe_write import refuse_overwrite
from nan_hunter.errors import NanHunterError
from nan_hunter.training.script_files import ScriptFiles
from tests.conftest import ROOT

NH = [sys.executable, "-m", "nan_hunter"]

MODELS = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + torch.log(x[:, :1])  # culprit: log(0) at the step whose x[:, 0] is 0
"""

# a loop whose loss is -inf at step 3 (x[:, 0] = 0 there)
LOOP = """\
import os
import sys
import torch
from models import Net

torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)


def step(n):
    x = torch.rand(4, 4) + 1
    if n == 3:
        x[:, 0] = 0.0
    loss = model(x).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def project(tmp_path: Path, body: str, *, loop: str = LOOP) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    script = tmp_path / "train.py"
    script.write_text(loop + textwrap.dedent(body))
    return script


def nan_hunter(*args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*NH, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nan-hunter: ")]


PLAIN = """
for n in range(1, 6):
    step(n)
print("done")
"""


# ----------------------------------------------------------------- the pieces, in the suite


def test_one_file_for_report_and_patch_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with pytest.raises(NanHunterError, match=r"the report and the patch to one file"):
        refuse_overwrite(target, tmp_path / "." / "out.txt", {})


def test_a_protected_file_is_named_in_the_refusal(tmp_path: Path) -> None:
    config = tmp_path / "nh.yaml"
    with pytest.raises(NanHunterError, match=r"refusing to write the patch to .*nh\.yaml: it is "
                                             r"the --config file; choose another file"):
        refuse_overwrite(None, config, {os.path.realpath(config): "the --config file"})


def test_script_files_sees_opens_renames_and_outside_changes(tmp_path: Path) -> None:
    read, written, renamed, changed, created, alone = (
        tmp_path / f"{n}.json" for n in ("read", "written", "renamed", "changed", "new", "alone")
    )
    for path in (read, written, changed, alone):
        path.write_text("{}")
    files = ScriptFiles([str(p) for p in (read, written, renamed, changed, created, alone)])
    files.install()
    try:
        read.read_text()
        with open(os.path.relpath(written), "a") as out:  # a relative name counts too
            out.write(" ")
        (tmp_path / "tmp").write_text("x")
        os.replace(tmp_path / "tmp", renamed)
        files.close()  # what follows is outside the hook's sight: seen by its stat
        changed.write_text('{"a": 1}')
        created.write_text("{}")
        assert files.what_the_script_did(str(read)) == "a file the script read during the run"
        assert files.what_the_script_did(str(written)) == "a file the script wrote during the run"
        assert files.what_the_script_did(str(renamed)) == "a file the script wrote during the run"
        assert files.what_the_script_did(str(changed)) == "a file changed during the run"
        assert files.what_the_script_did(str(created)) == "a file created during the run"
        assert files.what_the_script_did(str(alone)) is None
        assert files.what_the_script_did(__file__) == "a file the script imported"
    finally:
        files.close()


def test_script_files_does_not_count_our_own_write(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    files = ScriptFiles([str(report)])
    files.install()
    try:
        files.writing(str(report), True)
        report.write_text("ours")
        files.writing(str(report), False)
        assert files.what_the_script_did(str(report)) is None
        assert not files.overwritten_since(str(report))
        time.sleep(0.01)
        report.write_text("the script's, after ours")
        assert files.overwritten_since(str(report))
    finally:
        files.close()


# ----------------------------------------------------------------- files never lost (processes)


@pytest.mark.slow
def test_report_over_a_module_the_script_imports_is_refused(tmp_path: Path) -> None:
    project(tmp_path, PLAIN)
    done = nan_hunter("run", "--no-verify", "-o", "models.py", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert (tmp_path / "models.py").read_text() == MODELS
    lines = ours(done.stderr)
    assert lines[0] == (
        f"nan-hunter: error: refusing to write the report to {tmp_path / 'models.py'}: it is a "
        "file the script imported; choose another file; the report is on stderr"
    )
    assert lines[1].startswith("nan-hunter: training step 3: the loss is -inf; NH301 torch.log")
    assert lines[1].endswith("(report on stderr)")
    assert "error[NH301]" in done.stderr


@pytest.mark.slow
def test_config_file_and_one_file_for_both_are_refused_before_the_script_runs(
    tmp_path: Path,
) -> None:
    project(tmp_path, 'open("ran", "w").close()\n' + PLAIN)
    config = tmp_path / "nh.yaml"
    config.write_text("policy: cuda\n")
    done = nan_hunter("run", "--config", "nh.yaml", "-o", "nh.yaml", "train.py", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"nan-hunter: error: refusing to write the report to {config}: it is the --config "
        "file; choose another file\n"
    )
    both = nan_hunter("run", "-o", "x.txt", "--patch", "x.txt", "train.py", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr == (
        f"nan-hunter: error: refusing to write the report and the patch to one file "
        f"({tmp_path / 'x.txt'}): choose two files\n"
    )
    assert config.read_text() == "policy: cuda\n"
    assert not (tmp_path / "ran").exists() and not (tmp_path / "x.txt").exists()


@pytest.mark.slow
def test_scan_refuses_one_file_for_report_and_patch(tmp_path: Path) -> None:
    done = nan_hunter("scan", str(ROOT / "examples" / "clean_mlp.py"), "-o", "same",
                      "--patch", "same", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("nan-hunter: error: refusing to write the report and the patch")
    assert not (tmp_path / "same").exists()


@pytest.mark.slow
def test_report_over_a_file_the_script_writes_is_refused(tmp_path: Path) -> None:
    project(tmp_path, 'with open("results.json", "w") as out:\n    out.write("{\\"acc\\": 1}")\n'
            + PLAIN)
    done = nan_hunter("run", "--no-verify", "--format", "json", "-o", "results.json", "train.py",
                      cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert (tmp_path / "results.json").read_text() == '{"acc": 1}'
    assert ours(done.stderr)[0] == (
        f"nan-hunter: error: refusing to write the report to {tmp_path / 'results.json'}: it is "
        "a file the script wrote during the run; choose another file; the report is on stderr"
    )


@pytest.mark.slow
def test_a_clean_run_whose_report_is_refused_exits_2(tmp_path: Path) -> None:
    project(tmp_path, 'open("log.txt", "w").write("mine")\nprint("done")\n')
    done = nan_hunter("run", "-o", "log.txt", "train.py", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (tmp_path / "log.txt").read_text() == "mine"


@pytest.mark.slow
def test_only_the_process_that_started_the_run_reports(tmp_path: Path) -> None:
    project(tmp_path, """
        pid = os.fork()
        if pid == 0:  # the child: waits for the parent's report, then ends as scripts do
            import time
            time.sleep(3)
            sys.exit(0)
        for n in range(1, 6):
            step(n)
        os.waitpid(pid, 0)
        print("done")
    """)
    done = nan_hunter("run", "--no-verify", "--on-problem", "continue", "--format", "json",
                      "-o", "report.json", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    summaries = [line for line in ours(done.stderr) if "checked" in line]
    assert summaries == [
        "nan-hunter: 5 optimizer steps checked, 1 problem step (the first at step 3); the script "
        "exited with code 0"
    ]
    data = json.loads((tmp_path / "report.json").read_text())
    assert (data["status"], data["training"]["problem_step"]) == ("findings", 3)


# ----------------------------------------------------------------- no silent success


@pytest.mark.slow
def test_os_exit_0_after_a_reported_problem_is_exit_1(tmp_path: Path) -> None:
    project(tmp_path, """
        try:
            for n in range(1, 6):
                step(n)
        except SystemExit:
            os._exit(0)
    """)
    done = nan_hunter("run", "--no-verify", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert ours(done.stderr)[0].startswith("nan-hunter: training step 3: the loss is -inf")


@pytest.mark.slow
def test_a_swallowed_stop_holds_and_no_update_follows(tmp_path: Path) -> None:
    loop = LOOP.replace("lr=0.0", "lr=0.1")
    project(tmp_path, """
        updates = 0
        for n in range(1, 7):
            before = model.fc.bias.detach().clone()
            try:
                step(n)
            except:  # noqa: E722  a bare except, as scripts have
                pass
            updates += not torch.equal(before, model.fc.bias)
        print("updates", updates)
    """, loop=loop)
    done = nan_hunter("run", "--no-verify", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "updates 2\n"  # steps 1 and 2; none from the bad step 3 on


@pytest.mark.slow
def test_a_hand_written_update_with_a_nan_loss_is_a_problem(tmp_path: Path) -> None:
    loop = LOOP.replace("optimizer = torch.optim.SGD(model.parameters(), lr=0.0)\n", "").replace(
        "    optimizer.step()\n    optimizer.zero_grad()\n",
        "    with torch.no_grad():\n        for p in model.parameters():\n"
        "            p -= 0.0 * p.grad\n            p.grad = None\n",
    )
    project(tmp_path, PLAIN, loop=loop)
    done = nan_hunter("run", "--no-verify", "--format", "json", "-o", "report.json", "train.py",
                      cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = ours(done.stderr)
    assert lines[0].startswith("nan-hunter: training step 3: the loss is -inf; NH301 torch.log")
    assert lines[-1] == (
        "nan-hunter: no torch optimizer was seen: the loss of 3 backward passes checked, the "
        "gradients and the weight updates were not watched, 1 problem step (the first at step "
        "3); the script was stopped (--on-problem stop)"
    )
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "findings"
    training = {k: data["training"][k] for k in ("steps_checked", "problem_step", "losses_checked")}
    assert training == {"steps_checked": 0, "problem_step": 3, "losses_checked": 3}
    assert data["training"]["verdict"] == "real_bug"


@pytest.mark.slow
def test_a_run_that_checked_nothing_is_not_clean(tmp_path: Path) -> None:
    project(tmp_path, 'with torch.no_grad():\n    model(torch.ones(2, 4))\nprint("done")\n')
    done = nan_hunter("run", "--format", "json", "-o", "report.json", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # the script's own: nothing was found
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "not_checked"
    assert data["target"]["notes"][0].startswith(
        "no optimizer step and no backward were seen: nothing was checked"
    )


# ----------------------------------------------------------------- run-time behaviour


@pytest.mark.slow
def test_sigterm_to_nan_hunter_reaches_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import signal, sys, time
        import torch

        def checkpoint(number, frame):
            print("checkpoint saved", flush=True)
            sys.exit(7)

        signal.signal(signal.SIGTERM, checkpoint)
        print("ready", flush=True)
        time.sleep(60)
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*NH, "run", "train.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)  # to nan-hunter alone
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (7, "checkpoint saved\n"), err


@pytest.mark.slow
def test_a_folder_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    package = tmp_path / "pkgdir"
    package.mkdir()
    (package / "models.py").write_text(MODELS)
    (package / "__main__.py").write_text(LOOP + PLAIN)
    done = nan_hunter("run", "--no-verify", "pkgdir", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert ours(done.stderr)[0].startswith("nan-hunter: training step 3: the loss is -inf; NH301")
    missing = nan_hunter("run", str(tmp_path), cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr == (
        f"nan-hunter: error: {tmp_path} is a folder without __main__.py: nothing to run\n"
    )


OVERFLOW = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h @ h.t()  # culprit: beyond 65504 in float16 at the step whose x is large
"""

OVERFLOW_LOOP = """\
import torch
from models import Net

torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
for n in range(1, 6):
    if n == 2:  # the user edits the model file while it trains
        with open("models.py") as f:
            text = f.read()
        with open("models.py", "w") as f:
            f.write("# edited\\n# edited\\n" + text)
    x = torch.rand(4, 4) * (1e3 if n == 3 else 1.0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.slow
def test_a_model_file_edited_during_the_run_gets_no_patch(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(OVERFLOW)
    (tmp_path / "train.py").write_text(OVERFLOW_LOOP)
    done = nan_hunter("run", "--patch", "fix.patch", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert ours(done.stderr)[0].startswith("nan-hunter: training step 3: the loss is ")
    assert "models.py changed after the run started: the line shown is read from the file as " \
           "it is now and may hold another statement; no fix is offered" in done.stderr
    assert "nan-hunter: no patch to write: no finding has a fix to apply" in ours(done.stderr)
    assert not (tmp_path / "fix.patch").exists()


@pytest.mark.slow
def test_a_stop_in_a_training_thread_is_quiet_and_holds(tmp_path: Path) -> None:
    project(tmp_path, """
        import threading

        def loop():
            for n in range(1, 6):
                step(n)

        thread = threading.Thread(target=loop)
        thread.start()
        thread.join()
        print("after the thread")
        before = model.fc.bias.detach().clone()
        try:
            step(6)  # the main thread trains on: the stop holds
        except SystemExit:
            print("stopped again")
        print("changed", not torch.equal(before, model.fc.bias))

        def broken():
            raise ValueError("the thread's own error")

        failing = threading.Thread(target=broken)
        failing.start()
        failing.join()
    """)
    done = nan_hunter("run", "--no-verify", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "after the thread\nstopped again\nchanged False\n"
    assert "StopRun" not in done.stderr
    assert "ValueError: the thread's own error" in done.stderr  # the script's own, as Python
    assert "nan_hunter" not in done.stderr.split("ValueError")[0].split("Exception in thread")[-1]


@pytest.mark.slow
def test_a_script_that_replaces_torch_isfinite_still_gets_its_problem(tmp_path: Path) -> None:
    liars = (
        "torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)\n"
        "torch.Tensor.isfinite = lambda self: torch.ones_like(self, dtype=torch.bool)\n"
    )
    project(tmp_path, liars + PLAIN)
    done = nan_hunter("run", "--no-verify", "--no-save-repro", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = ours(done.stderr)
    assert lines[0].startswith("nan-hunter: training step 3: the loss is -inf; NH301 torch.log")
    assert lines[-2] == (
        "nan-hunter: warning: the script replaced torch.isfinite, torch.Tensor.isfinite; "
        "nan-hunter's checks used torch's own functions, not the replacements"
    )
