"""A chain of thousands of ops one after another (an ``nn.Sequential`` of small layers): the
tracer holds each op's autograd node for its backward hooks, and letting go of them oldest
first made the last node free the whole chain below it in one recursive deallocation, whose C
stack overflowed (SIGSEGV at 100,000 layers with the default 8 MiB stack). Reproduced here at
2,000 layers in a process whose stack is limited to 256 KiB."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import torch
from torch import nn
import nan_hunter
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(2000)])
report = nan_hunter.scan(model, torch.randn(2, 4), verify_fixes=False)
print(report.ops, report.backward_nodes)
"""


def _small_stack() -> None:
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    resource.setrlimit(resource.RLIMIT_STACK, (256 * 1024, hard))


@pytest.mark.slow
def test_a_long_chain_of_ops_is_released_without_deep_recursion() -> None:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=_small_stack,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["2000", "2000"]  # ops traced, backward nodes
