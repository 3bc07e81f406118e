"""``nan-hunter run`` on unmodified framework scripts: the Hugging Face Trainer, PyTorch
Lightning, accelerate and torchrun (DDP, 2 gloo ranks). Real processes of several seconds each
(a framework import, a scan), so behind the ``slow`` marker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, marker_line

SCRIPTS = ROOT / "tests" / "run_scripts"
NH = [sys.executable, "-m", "nan_hunter", "run", "--no-verify", "--no-save-repro"]

pytestmark = pytest.mark.slow


def run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nan-hunter: ")]


def culprit(script: str) -> str:
    return f"tests/run_scripts/{script}:{marker_line(SCRIPTS / script, '# culprit')}"


def test_hf_trainer_script(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    done = run([*NH, "tests/run_scripts/hf_trainer_train.py", str(tmp_path)])
    assert done.returncode == 1, done.stderr
    assert "trained" not in done.stdout
    assert ours(done.stderr) == [
        "nan-hunter: training step 4: the loss is inf; NH301 Tensor.pow in Regressor at "
        f"{culprit('hf_trainer_train.py')}; real bug (report on stderr)",
        "nan-hunter: 3 optimizer steps checked, 1 problem step (the first at step 4); the script "
        "was stopped (--on-problem stop)",
    ]
    assert "float32 on cpu" in done.stderr  # the Trainer ran in FP32: a real bug, in FP32


def test_lightning_script_optimizer_with_a_closure(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    done = run([*NH, "tests/run_scripts/lightning_train.py", str(tmp_path)])
    assert done.returncode == 1, done.stderr
    assert ours(done.stderr)[0] == (
        "nan-hunter: training step 7: the loss is nan; NH102 Tensor.__matmul__ in "
        f"LitPairs.pairs at {culprit('lightning_train.py')}; precision problem (report on "
        "stderr)"
    )


def test_accelerate_script() -> None:
    pytest.importorskip("accelerate")
    done = run([*NH, "tests/run_scripts/accelerate_train.py"])
    assert done.returncode == 1, done.stderr
    assert ours(done.stderr)[0] == (
        "nan-hunter: training step 7: the loss is nan; NH102 Tensor.__matmul__ in PairScorer at "
        f"{culprit('accelerate_train.py')}; precision problem (report on stderr)"
    )


def test_torchrun_ddp_two_gloo_ranks_stop_at_the_same_step() -> None:
    done = run([
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", "29531", "-m", "nan_hunter", "run", "--no-verify", "--no-save-repro",
        "tests/run_scripts/ddp_train.py",
    ])
    assert done.returncode == 1
    lines = ours(done.stderr)
    assert (
        "nan-hunter: rank 1: training step 4: the loss is inf; NH102 Tensor.__matmul__ in "
        f"PairScorer at {culprit('ddp_train.py')}; precision problem (report on stderr)"
    ) in lines
    # DDP's all-reduce made rank 0's gradients NaN too; the ranks agree that rank 1, whose own
    # loss broke, re-runs its step
    assert (
        "nan-hunter: rank 0: training step 4: non-finite gradient (4 of the optimizer's "
        "parameters); not re-run: another rank re-runs its step"
    ) in lines
    assert "trained" not in done.stdout


def test_torchrun_ranks_agree_so_a_problem_on_one_rank_stops_all() -> None:
    """No DDP: only rank 1 sees its NaN; the script's own all-reduce after each step would
    leave rank 0 waiting for a peer that stopped (before: rank 0 died of "Connection closed by
    peer", with NCCL it would hang). The ranks now agree at each step: both stop at step 3."""
    done = run([
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", "29533", "-m", "nan_hunter", "run", "--no-verify", "--no-save-repro",
        "tests/run_scripts/ranks_train.py",
    ])
    assert done.returncode == 1
    assert "Connection closed" not in done.stderr
    assert sorted(ours(done.stderr)) == [
        "nan-hunter: rank 0: 2 optimizer steps checked, 1 problem step (the first at step 3); "
        "the script was stopped (--on-problem stop)",
        "nan-hunter: rank 0: training step 3: rank 1 saw a problem at this step; not re-run: "
        "another rank re-runs its step",
        "nan-hunter: rank 1: 2 optimizer steps checked, 1 problem step (the first at step 3); "
        "the script was stopped (--on-problem stop)",
        "nan-hunter: rank 1: training step 3: the loss is nan; NH001 input in Sequential; real "
        "bug (report on stderr)",
    ]


def test_torchrun_fsdp2_two_ranks_stop_together_and_rank_1_re_runs_a_gathered_copy(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    done = run([
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", "29535", "-m", "nan_hunter", "run", "--no-verify", "--no-save-repro",
        "--format", "json",
        "-o", str(report), "tests/run_scripts/fsdp_train.py",
    ])
    assert done.returncode == 1
    lines = ours(done.stderr)
    assert (
        "nan-hunter: rank 1: training step 3: the loss is nan; NH301 torch.log in Sequential.0 "
        f"at {culprit('fsdp_train.py')}; real bug (report {report})"
    ) in lines
    assert (
        "nan-hunter: rank 0: training step 3: non-finite gradient (4 of the optimizer's "
        "parameters); not re-run: another rank re-runs its step"
    ) in lines
    first = json.loads(report.read_text())["findings"][0]
    assert (first["code"], first["op"], first["module"]) == ("NH301", "torch.log", "0")
    assert "trained" not in done.stdout
