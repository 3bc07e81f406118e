"""The public names keep working whatever the folders inside the package (issue 40).

Users import these; a move inside the package must not break them: the facade's functions, the
old ``nan_hunter.watch`` module, the framework callbacks, the pytest plugin's entry point, the
console script's ``nan_hunter.cli:main`` and ``python -m nan_hunter``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import nan_hunter

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_facade_functions() -> None:
    from nan_hunter import render, scan, scan_file, watch

    for function in (scan, scan_file, watch, render):
        assert callable(function)
    assert nan_hunter.scan is scan and nan_hunter.scan_file is scan_file
    assert {"scan", "scan_file", "watch", "render"} <= set(nan_hunter.__all__)
    for name in nan_hunter.__all__:
        assert getattr(nan_hunter, name) is not None


def test_the_old_watch_module() -> None:
    from nan_hunter import training
    from nan_hunter.watch import Watcher, watch

    assert watch is training.watch and Watcher is training.Watcher


def test_the_command_line_entry_points() -> None:
    from nan_hunter.cli import app, main

    assert callable(main) and app.registered_commands
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = script["nan-hunter"].partition(":")
    assert getattr(importlib.import_module(module), name) is main


def test_python_dash_m_prints_the_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "--version"],
        capture_output=True, text=True, timeout=120, cwd=ROOT / "tests",
    )
    assert (result.returncode, result.stdout) == (0, f"nan-hunter {nan_hunter.__version__}\n")


def test_the_pytest_plugin_entry_point() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert declared["project"]["entry-points"]["pytest11"] == {
        "nan_hunter": "nan_hunter.pytest_plugin"
    }
    plugin = importlib.import_module("nan_hunter.pytest_plugin")
    assert callable(plugin.assert_amp_safe) and callable(plugin.amp_safe)
    found = [e for e in entry_points(group="pytest11") if e.name == "nan_hunter"]
    if found:  # installed (editable or not): the entry point loads the same module
        assert found[0].load() is plugin


def test_the_transformers_callback() -> None:
    pytest.importorskip("transformers")
    from nan_hunter.integrations.transformers import NanHunterCallback

    assert callable(NanHunterCallback)


def test_the_lightning_callback() -> None:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        pytest.importorskip("pytorch_lightning")
    from nan_hunter.integrations.lightning import NanHunterCallback

    assert callable(NanHunterCallback)
