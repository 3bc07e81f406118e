"""``nan_hunter.scan`` called at the top level of a script without a ``__main__`` guard: fix
verification re-imports the patched script for its classes and must run only its definitions,
not the caller's program (training, file writes, the scan call itself, ``sys.exit``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    from torch import nn

    import nan_hunter

    SCALE = 1000.0


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) * SCALE


    log = Path("runs.log")
    log.write_text(log.read_text() + "top level ran\\n" if log.exists() else "top level ran\\n")
    torch.manual_seed(0)
    report = nan_hunter.scan(Model(), torch.full((4, 8), 100.0), backward=False)
    print("FIXES", [f.fix.verified for f in report.findings if f.fix is not None])
    print("WHY", [f.fix.remaining for f in report.findings if f.fix is not None])
    sys.exit(7)
    """
)


def test_verification_does_not_run_an_unguarded_scripts_top_level_again(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 7, done.stderr
    assert (tmp_path / "runs.log").read_text() == "top level ran\n"
    assert "FIXES [True]" in done.stdout, (done.stdout, done.stderr)


def test_a_definition_needing_the_scripts_program_says_why_it_is_not_verified(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.replace("SCALE = 1000.0", "SCALE = float('1000')"))
    done = subprocess.run(
        [sys.executable, "-c", "import runpy; runpy.run_path('train.py', run_name='__main__')"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 7, done.stderr
    assert (tmp_path / "runs.log").read_text() == "top level ran\n"
    assert "FIXES [False]" in done.stdout, (done.stdout, done.stderr)
    assert "name 'SCALE' is not defined" in done.stdout, done.stdout
    assert "the script's own program, 8 top-level statements from line 10, is not run again" \
        in done.stdout, done.stdout
