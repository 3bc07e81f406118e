"""A scan leaves nothing in the temporary folder: torch's own cache folder included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--steps", "2")], ids=["scan", "steps"])
def test_a_scan_leaves_the_temporary_folder_as_it_found_it(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("NAN_HUNTER_IN_PROCESS",
                                                            "TORCHINDUCTOR_CACHE_DIR")}
    env["TMPDIR"] = str(temp)
    result = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", str(EXAMPLES / "clean_mlp.py"), *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in temp.iterdir()) == []
