"""``nan-hunter run``'s reproduction bundle and loss spikes, through real processes: the
bundle a run writes at its problem step is re-run by ``nan-hunter scan`` in a fresh process,
in place and from a copy of the project; a loss spike is one warning line, or a problem step."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, marker_line

SCRIPTS = ROOT / "tests" / "run_scripts"
NH = [sys.executable, "-m", "nan_hunter"]
CULPRIT = marker_line(SCRIPTS / "pairs_train.py", "# culprit")

pytestmark = pytest.mark.slow


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nan-hunter: ")]


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NH, "run", *args], capture_output=True, text=True, cwd=folder,
                          timeout=300)


def _first(report: Path) -> tuple[str, str, str, int]:
    finding = json.loads(report.read_text())["findings"][0]
    location = finding["location"]
    return finding["code"], finding["op"], Path(location["file"]).name, location["line"]


def test_the_bundle_of_a_problem_step_reproduces_its_finding_with_scan(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SCRIPTS / "pairs_train.py", project / "train.py")
    report = tmp_path / "run.json"
    done = _run(project, "--no-verify", "--format", "json", "-o", str(report), "train.py",
                "--steps", "30")
    assert done.returncode == 1, done.stderr
    bundle = project / "nan-hunter-repro-step12"
    size = sum(p.stat().st_size for p in bundle.iterdir())
    assert _ours(done.stderr)[1] == (
        f"nan-hunter: reproduction saved to nan-hunter-repro-step12 ({round(size / 1024)} KB): "
        "nan-hunter scan nan-hunter-repro-step12/model.py"
    )
    assert json.loads(report.read_text())["training"]["repro"] == {
        "path": str(bundle), "bytes": size, "written": True, "note": ""}
    assert _first(report) == ("NH102", "Tensor.__matmul__", "train.py", CULPRIT)
    # a fresh process, in place, then from a copy of the project in another folder
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(project, elsewhere)
    for folder in (project, elsewhere):
        scanned = tmp_path / f"scan-{folder.name}.json"
        done = subprocess.run(
            [*NH, "scan", "--no-verify", "--format", "json", "-o", str(scanned),
             "nan-hunter-repro-step12/model.py"],
            capture_output=True, text=True, cwd=folder, timeout=300,
        )
        assert done.returncode == 1, done.stderr
        assert _first(scanned) == ("NH102", "Tensor.__matmul__", "train.py", CULPRIT)
        location = json.loads(scanned.read_text())["findings"][0]["location"]["file"]
        assert (folder / location).resolve() == (folder / "train.py").resolve()


def test_no_save_repro_writes_nothing_and_the_cap_is_honoured(tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "pairs_train.py", tmp_path / "train.py")
    done = _run(tmp_path, "--no-verify", "--no-save-repro", "train.py", "--steps", "30")
    assert done.returncode == 1, done.stderr
    assert not any("repro" in line for line in _ours(done.stderr))
    done = _run(tmp_path, "--no-verify", "--repro-max-mb", "0.01", "train.py", "--steps", "30")
    assert done.returncode == 1, done.stderr
    assert _ours(done.stderr)[1] == (
        "nan-hunter: no reproduction saved: it would hold 24 KB, over --repro-max-mb 0.01: "
        "nothing written"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_loss_spike_is_one_warning_line_and_the_run_goes_on(tmp_path: Path) -> None:
    done = _run(tmp_path, str(SCRIPTS / "spike_train.py"))
    assert done.returncode == 0, done.stderr
    assert _ours(done.stderr) == [
        "nan-hunter: warning: training step 20: the loss 5.52e+03 is 687x its running "
        "median 8.03",
        "nan-hunter: 30 optimizer steps checked, no problem; the script exited with code 0",
    ]
    assert done.stdout == "done\n" and list(tmp_path.iterdir()) == []


def test_spikes_are_problems_makes_the_spike_a_problem_step(tmp_path: Path) -> None:
    done = _run(tmp_path, "--spikes-are-problems", "--no-verify", "--no-save-repro",
                str(SCRIPTS / "spike_train.py"), "--scaler")
    assert done.returncode == 1, done.stderr
    lines = _ours(done.stderr)
    assert lines[0].startswith(
        "nan-hunter: training step 20: the loss 5.65e+03 is 686x its running median 8.23; "
        "NH401 torch.nn.functional.linear in Linear at "
    )
    assert lines[1] == ("nan-hunter: 19 optimizer steps checked, 1 problem step (the first at "
                        "step 20); the script was stopped (--on-problem stop)")
