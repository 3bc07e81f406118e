"""Find the project's nan-hunter settings: the nearest ``nan-hunter.yaml``, ``.nan-hunter.yaml``
or ``pyproject.toml`` with a ``[tool.nan-hunter]`` table.

The search starts in the folder of the scanned paths (their common folder when there are several;
the working directory when there are none) and walks up to the filesystem root. The first folder
that holds any of the three files decides; within a folder ``nan-hunter.yaml`` comes before
``.nan-hunter.yaml``, which comes before ``pyproject.toml``. A ``pyproject.toml`` without a
``[tool.nan-hunter]`` table does not count. Keys in ``pyproject.toml`` may be spelled with
hyphens (``fail-on``) or underscores (``fail_on``).

Settings then apply in this order, each overriding the one before: ``configs/default.yaml``,
the discovered file, ``--config FILE``, command-line flags.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from nan_hunter.errors import ConfigError
from nan_hunter.project.config import PYPROJECT, TABLE, ProjectConfig, Settings, read_config_file
from nan_hunter.project.targets import visible

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

YAML_NAMES = ("nan-hunter.yaml", ".nan-hunter.yaml")


def search_start(paths: Iterable[str]) -> Path:
    """The folder the search starts in: the common folder of ``paths`` that exist on disk (a
    file's own folder), or the working directory."""
    folders = []
    for raw in paths:
        path = Path(raw)
        if visible(path):  # False where the system cannot look: its scan says why
            resolved = path.resolve()
            folders.append(resolved if resolved.is_dir() else resolved.parent)
    if not folders:
        return Path.cwd().resolve()
    return Path(os.path.commonpath([str(f) for f in folders]))


def discover(start: Path) -> ProjectConfig | None:
    """The nearest project settings at or above ``start``; None when there are none."""
    for folder in (start, *start.parents):
        for name in YAML_NAMES:
            candidate = folder / name
            if candidate.is_file():
                return ProjectConfig(candidate, _read_yaml(candidate))
        pyproject = folder / PYPROJECT
        if pyproject.is_file():
            table = _read_pyproject(pyproject)
            if table is not None:
                return ProjectConfig(pyproject, table)
    return None


def _read_yaml(path: Path) -> Mapping[str, Any]:
    return read_config_file(path)


def _read_pyproject(path: Path) -> Mapping[str, Any] | None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    tool = data.get("tool")
    if not isinstance(tool, dict) or TABLE not in tool:
        return None
    table = tool[TABLE]
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.{TABLE}] must be a table of settings")
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in values:  # fail-on and fail_on: the last would silently win
            raise ConfigError(
                f"{path} [tool.{TABLE}]: {spelled[name]!r} and {key!r} are the same setting; "
                "keep one"
            )
        values[name], spelled[name] = value, key
    return values


def describe(settings: Settings, project: ProjectConfig | None) -> str:
    """The effective settings as YAML, each with its source in a comment."""
    found = project.label if project is not None else "none found"
    lines = [f"# project settings: {found}"]
    for key, source in settings.sources.items():
        value = getattr(settings, key)
        if isinstance(value, tuple):
            value = list(value)
        text = yaml.safe_dump({key: value}, default_flow_style=True, width=10**6).strip()
        lines.append(f"{text.removeprefix('{').removesuffix('}'):<34} # {_source(source)}")
    return "\n".join(lines) + "\n"


def _source(label: str) -> str:
    return "default (configs/default.yaml)" if label == "default" else label
