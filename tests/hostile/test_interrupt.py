"""Ctrl-C during a scan: exit 130, no traceback, and the scan process is stopped too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nan_hunter.isolation import IN_PROCESS_ENV
from tests.hostile.cases import gone, model

HANG = model(build="import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(600)")


def test_ctrl_c_exits_130_and_stops_the_scan_process(work: Path) -> None:
    (work / "model.py").write_text(HANG)
    env = {k: v for k, v in os.environ.items() if k != IN_PROCESS_ENV}
    cli = subprocess.Popen(
        [sys.executable, "-c", "from nan_hunter.cli import main; main()", "scan", "model.py"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (work / "pid").exists() or not (work / "pid").read_text():
            assert time.monotonic() < deadline and cli.poll() is None, cli.stderr.read()
            time.sleep(0.1)
        scan_pid = int((work / "pid").read_text())
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
    finally:
        cli.kill()
    assert cli.returncode == 130, err
    assert b"Traceback" not in err
    deadline = time.monotonic() + 10
    while not gone(scan_pid):
        assert time.monotonic() < deadline, "the scan process outlived the CLI"
        time.sleep(0.1)
