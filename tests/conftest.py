"""Shared test helpers: fixture paths, culprit markers, golden files."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from nan_hunter.findings import Report

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
CLI_FROM_A_TERMINAL = [
    sys.executable, "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from nan_hunter.cli import main; main()",
]  # fmt: skip
"""The command line as a terminal starts it, Ctrl-C raising ``KeyboardInterrupt``, also when
the suite itself was started with SIGINT ignored (``nohup ... &``: Python then leaves it
ignored, and a test's SIGINT would never arrive)."""

PRECISION_FIXES = [
    EXAMPLES / "matrix_inverse.py",
    EXAMPLES / "attention_unscaled.py",
    FIXTURES / "fx_cast_overflow.py",
    FIXTURES / "fx_matmul_overflow.py",
    FIXTURES / "fx_linear_overflow.py",
    FIXTURES / "fx_mul_overflow.py",
    FIXTURES / "fx_eps_large_change.py",
    FIXTURES / "fx_fp16_linalg.py",
    FIXTURES / "fx_add_overflow.py",
    FIXTURES / "fx_flush_log.py",
    FIXTURES / "fx_atanh_rounding.py",
]
"""Models whose first finding has an FP32-region patch (default settings). Not
``fx_eps_underflow.py``: its first fix is the eps FP16 holds, the change of the cause."""


_SCANS: dict[tuple[object, ...], Report] = {}


def scanned(path: Path, **options: Any) -> Report:
    """``scan_file(path)`` with ``options`` over the default settings, scanned once per test
    session: several test files read the reports of the same fixtures, and reports are frozen.
    Only for tests that read the report (not the scan's output, timing or side effects); a file
    changed since is scanned again."""
    from nan_hunter.api import scan_file
    from nan_hunter.project.config import load_settings

    path = Path(path).resolve()
    key = (str(path), path.stat().st_mtime_ns, repr(sorted(options.items())))
    if key not in _SCANS:
        settings = load_settings(overrides=options) if options else None
        _SCANS[key] = scan_file(str(path), settings)
    return _SCANS[key]


def fixture_options(path: Path) -> dict[str, object]:
    """Settings a fixture asks for (``EXPECTED["options"]``: half mode, no loss scaling)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_options_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = getattr(module, "EXPECTED", None)
    return dict(expected.get("options", {})) if isinstance(expected, dict) else {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/* from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden")) or bool(
        os.environ.get("NAN_HUNTER_UPDATE_GOLDEN")
    )


def marker_line(path: Path, marker: str) -> int:
    """1-based line whose code ends with ``marker`` (the culprit comment in fixture files)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [i for i, line in enumerate(lines, start=1) if line.rstrip().endswith(marker)]
    assert len(hits) == 1, f"{path.name}: expected one line ending in {marker!r}, got {hits}"
    return hits[0]


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports show paths relative to the working directory: pin it to the repo root."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(autouse=True)
def _scan_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI tests that are not about isolation run the scan in the test's process (an internal
    switch, see ``nan_hunter.process.isolation``): a scan process costs a torch import per test.
    ``tests/hostile`` runs the real scan process."""
    if "hostile" not in request.node.path.parts:
        monkeypatch.setenv("NAN_HUNTER_IN_PROCESS", "1")


@pytest.fixture(autouse=True, scope="session")
def _no_repro_bundles_left_in_the_repository() -> Iterator[None]:
    """``nan-hunter run`` saves a reproduction bundle at a problem step, by default into the
    working directory: the run tests that start in the repository leave theirs behind; the
    session removes those it made."""
    before = set(ROOT.glob("nan-hunter-repro-step*"))
    yield
    for folder in set(ROOT.glob("nan-hunter-repro-step*")) - before:
        if (folder / "model.py").is_file():
            shutil.rmtree(folder, ignore_errors=True)
