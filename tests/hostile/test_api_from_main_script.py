"""``nan_hunter.scan``
called from a script whose model class lives in ``__main__``. Verifying a fix imports the
patched copy of the script as ``__main__``, so its ``if __name__ == "__main__":`` block (the
user's training loop, here a second scan) runs again inside the scan."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn

    import nan_hunter


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) * 1000.0


    if __name__ == "__main__":
        print("MAIN BLOCK RAN")
        torch.manual_seed(0)
        report = nan_hunter.scan(Model(), torch.full((4, 8), 100.0), backward=False)
        print("FIXES", [f.fix.verified for f in report.findings if f.fix is not None])
    """
)


def test_verifying_a_fix_does_not_run_the_script_s_main_block_again(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("MAIN BLOCK RAN") == 1, done.stdout
    assert "FIXES [True]" in done.stdout, done.stdout
