"""Ctrl-C during a scan: exit 130, no traceback, and the scan process is stopped too; a CLI
killed outright (SIGKILL, as CI cancels a job) takes its scan process with it (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nan_hunter.process.isolation import IN_PROCESS_ENV
from tests.conftest import CLI_FROM_A_TERMINAL
from tests.hostile.cases import gone, model

HANG = model(build="import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(600)")


def _start_hanging_scan(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    (work / "model.py").write_text(HANG)
    env = {k: v for k, v in os.environ.items() if k != IN_PROCESS_ENV}
    cli = subprocess.Popen(
        [*CLI_FROM_A_TERMINAL, "scan", "model.py"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (work / "pid").exists() or not (work / "pid").read_text():
        if time.monotonic() > deadline or cli.poll() is not None:
            cli.kill()
            raise AssertionError(cli.communicate()[1].decode())
        time.sleep(0.1)
    return cli, int((work / "pid").read_text())


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while not gone(pid):
        assert time.monotonic() < deadline, "the scan process outlived the CLI"
        time.sleep(0.1)


def test_ctrl_c_exits_130_and_stops_the_scan_process(work: Path) -> None:
    cli, scan_pid = _start_hanging_scan(work)
    try:
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
    finally:
        cli.kill()
    assert cli.returncode == 130, err
    assert b"Traceback" not in err
    _wait_gone(scan_pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_cli_takes_its_scan_process_along(work: Path) -> None:
    cli, scan_pid = _start_hanging_scan(work)
    cli.kill()
    cli.communicate(timeout=30)
    _wait_gone(scan_pid)
