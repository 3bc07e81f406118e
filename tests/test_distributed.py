"""``watch`` under torchrun: two gloo ranks on the CPU, DDP with ``no_sync`` accumulation, a bad
batch on rank 1 only. Every rank must stop (or raise) at the same call, and rank 0 must hold
rank 1's report. A hang fails fast: the run has a hard timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.ddp_worker import ACCUMULATE, BAD_RANK, BAD_STEP

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "ddp_worker.py"
TIMEOUT_S = 180
"""Two processes importing torch on a busy 2-core runner take ~10-20 s; a hang takes this."""
BAD_CALL = BAD_STEP * ACCUMULATE  # the first micro-batch of the bad optimizer step

pytestmark = [
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="needs torch.distributed/gloo",
    ),
    pytest.mark.slow,  # torchrun ranks in processes of their own
]


def _torchrun(
    tmp_path: Path, *args: str, without_numpy: bool = False
) -> tuple[list[dict[str, Any]], str]:
    path = str(ROOT)
    if without_numpy:  # as with the torch wheel alone: NumPy is not one of its dependencies
        site = tmp_path / "no_numpy"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import sys\nsys.modules['numpy'] = None\n")
        path = os.pathsep.join([str(site), path])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(WORKER), "--out", str(tmp_path), *args,
    ]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s (a rank hangs): {exc.stderr!r}")
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, done.stderr


def test_every_rank_stops_at_the_same_call_and_rank0_holds_the_origins_report(
    tmp_path: Path,
) -> None:
    ranks, stderr = _torchrun(tmp_path, "--on-problem", "stop")
    assert [r["stopped_at"] for r in ranks] == [BAD_CALL, BAD_CALL]
    assert [r["calls"] for r in ranks] == [BAD_CALL + 1, BAD_CALL + 1]
    for r in ranks:
        assert r["seconds"] < 60, r
    zero, one = (r["events"][0] for r in ranks)
    assert (zero["rank"], zero["world_size"], one["rank"], one["world_size"]) == (0, 2, 1, 2)
    assert zero["step"] == one["step"] == BAD_CALL
    # rank 1's own loss went NaN: it is the origin; rank 0 only learned of it
    assert (one["reason"], zero["reason"]) == ("non_finite_loss", "problem_on_another_rank")
    assert zero["origin_rank"] == one["origin_rank"] == BAD_RANK
    # rank 0 holds rank 1's scan: the NaN in rank 1's batch (rank 0's batch is clean)
    assert zero["codes"] == one["codes"] == ["NH001"]
    # per-rank JSON reports, --output style names, and one summary line on rank 0
    assert zero["report_path"].endswith("nan.rank0.json")
    assert one["report_path"].endswith("nan.rank1.json")
    for r in range(2):
        data = json.loads((tmp_path / f"nan.rank{r}.json").read_text())
        assert [f["code"] for f in data["findings"]] == ["NH001"]
    summaries = [line for line in stderr.splitlines() if "nan-hunter: training step" in line]
    assert len(summaries) == 1, stderr[-3000:]
    assert f"training step {BAD_CALL} on 2 ranks: problem_on_another_rank, origin rank 1" in (
        summaries[0]
    )


def test_every_rank_raises_and_every_rank_gets_the_report(tmp_path: Path) -> None:
    """Also without NumPy: the report exchange must not need it (torch's ``*_object``
    collectives do)."""
    ranks, _ = _torchrun(
        tmp_path, "--on-problem", "raise", "--report-to", "all", without_numpy=True
    )
    assert [r["raised_at"] for r in ranks] == [BAD_CALL, BAD_CALL]
    assert [r["calls"] for r in ranks] == [BAD_CALL + 1, BAD_CALL + 1]
    assert "rank 0 of 2" in ranks[0]["message"] and "on rank 1 NH001" in ranks[0]["message"]
    for r in ranks:
        (event,) = r["events"]
        assert (event["origin_rank"], event["codes"]) == (BAD_RANK, ["NH001"])


def test_lightning_ddp_strategy_stops_every_rank_with_the_origins_report(tmp_path: Path) -> None:
    """Lightning's ``strategy="ddp"`` under torchrun (gloo, CPU) with ``NanHunterCallback``:
    rank 1's batch explodes at step 2; both ranks stop after it, rank 0 holds rank 1's scan."""
    pytest.importorskip("pytorch_lightning")
    from tests.lightning_ddp_worker import BAD_RANK as LIGHTNING_BAD_RANK
    from tests.lightning_ddp_worker import BAD_STEP as LIGHTNING_BAD_STEP

    worker = ROOT / "tests" / "lightning_ddp_worker.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(worker), "--out", str(tmp_path),
    ]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s (a rank hangs): {exc.stderr!r}")
    assert done.returncode == 0, done.stderr[-4000:]
    zero, one = (
        json.loads((tmp_path / f"lightning_rank{r}.json").read_text()) for r in range(2)
    )
    assert zero["global_step"] == one["global_step"] == LIGHTNING_BAD_STEP + 1  # of 6
    (e0,), (e1,) = zero["events"], one["events"]
    assert (e0["rank"], e0["world_size"], e1["rank"]) == (0, 2, 1)
    assert e0["step"] == e1["step"] == LIGHTNING_BAD_STEP
    assert e1["reason"] == "non_finite_loss"
    # rank 0's gradients went NaN through DDP's all-reduce; the culprit is rank 1's batch
    assert e0["origin_rank"] == e1["origin_rank"] == LIGHTNING_BAD_RANK
    assert e0["first"] == e1["first"] == ["NH101", "fc1"]
    assert zero["files"] == [
        f"nan_hunter_step{LIGHTNING_BAD_STEP + 1}.rank0.json",
        f"nan_hunter_step{LIGHTNING_BAD_STEP + 1}.rank0.txt",
    ]


def test_origin_rules_without_processes() -> None:
    """The origin is the first rank whose own loss broke; without one, every rank scans and the
    first whose scan found an error is the origin (DDP: all ranks see the all-reduced NaN)."""
    from nan_hunter.training.distributed import choose_origin, rank_path, scanning_ranks

    assert scanning_ranks([0, 2, 2, 1]) == [1]
    assert scanning_ranks([1, 1, 0, 0]) == [0, 1, 2, 3]
    assert choose_origin([1, 2, 2, 0], [None, True, None, None]) == 1
    assert choose_origin([1, 1, 1], [False, None, True]) == 2
    assert choose_origin([1, 1], [False, False]) == 0
    assert choose_origin([1, 1], [None, None]) is None
    from nan_hunter.training.distributed import Ranks

    assert rank_path("out/nan.json", None) == "out/nan.json"
    assert rank_path("out/nan.json", Ranks(3, 4, torch.device("cpu"))) == "out/nan.rank3.json"
