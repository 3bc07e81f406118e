"""File, class and module names the user's code controls cannot start a line of their own in
what nan-hunter prints (a CI log reads a line starting with ``::`` as a GitHub workflow
command): ``run``'s lines on stderr show them escaped, and a diff or patch names a file whose
name holds a newline C-quoted, as ``git diff`` does, so that ``git apply`` still applies it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = '''
import torch
from torch import nn


class Scores(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        return h @ h.t()  # culprit


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("s\\n::warning::mod", Scores())

    def forward(self, x):
        return getattr(self, "s\\n::warning::mod")(x)


Model.__name__ = Model.__qualname__ = "Model\\n::error title=injected::class"

torch.manual_seed(0)
model = Model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
x = torch.full((4, 8), 300.0)
with torch.autocast("cpu", dtype=torch.float16):
    loss = model(x).float().mean()
loss.backward()
optimizer.step()
'''


def test_script_controlled_names_cannot_start_a_workflow_command(tmp_path: Path) -> None:
    script = tmp_path / "train\n::error file=x::name.py"
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "run", "--no-verify", str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("nan-hunter: ")]
    problem = next(line for line in ours if "training step 1:" in line)
    assert "Model\\n::error title=injected::class" in problem, problem
    assert "train\\n::error file=x::name.py" in problem, problem
    assert not [line for line in done.stderr.splitlines() if line.startswith("::")]


def test_a_patch_for_a_file_named_with_a_newline_quotes_it_and_applies(tmp_path: Path) -> None:
    name = "m\n::error file=x::name.py"
    model = tmp_path / name
    shutil.copy(ROOT / "examples" / "matrix_inverse.py", model)
    original = model.read_text(encoding="utf-8")
    patch = tmp_path / "fix.patch"
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", "--no-verify", "--patch", str(patch), name],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1, done.stderr
    printed = done.stdout + done.stderr + patch.read_text(encoding="utf-8")
    assert not [line for line in printed.splitlines() if line.startswith("::")]
    assert '--- "a/m\\n::error file=x::name.py"' in patch.read_text(encoding="utf-8")
    applied = subprocess.run(
        ["git", "apply", str(patch)], capture_output=True, text=True, cwd=tmp_path
    )
    assert applied.returncode == 0, applied.stderr
    assert model.read_text(encoding="utf-8") != original
    assert "enabled=False" in model.read_text(encoding="utf-8")


HOSTILE_NAMES = {
    "newline": "m\n::warning::x.py",
    "tab": "m\tx.py",
    "carriage return": "m\r::error::x.py",
    "double quote": 'm"x.py',
    "backslash": "m\\x.py",
    "escape sequence": "m\x1b]0;title\x07.py",
    "non-ASCII beside a newline": "é\n.py",
    "bidi override": "m\u202ex.py",
}


@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=list(HOSTILE_NAMES))
@pytest.mark.parametrize("tool", ["git", "patch"])
def test_quoted_diff_headers_apply_with_git_and_patch(
    name: str, tool: str, tmp_path: Path
) -> None:
    from nan_hunter.findings import Edit
    from nan_hunter.fixes.edits import render_patch

    model = tmp_path / name
    model.write_text("x = 1\ny = 2\n", encoding="utf-8")
    patch = render_patch([Edit(str(model), 6, 12, "y = 3\n")], tmp_path)
    headers = [line for line in patch.split(b"\n") if line.startswith((b"---", b"+++"))]
    assert len(headers) == 2 and all(line.endswith(b'"') for line in headers), headers
    assert all(0x20 <= byte < 0x7F for line in headers for byte in line), headers
    command = ["git", "apply"] if tool == "git" else ["patch", "-p1", "--quiet"]
    applied = subprocess.run(command, input=patch, capture_output=True, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert model.read_text(encoding="utf-8") == "x = 1\ny = 3\n"


def test_a_plain_file_name_is_not_quoted() -> None:
    from nan_hunter.core.untrusted import diff_path

    assert diff_path("a/models/été.py") == "a/models/été.py"
