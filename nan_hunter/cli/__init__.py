"""The command line: typer commands (``commands``), their options (``options``) and what
they print (``output``, ``scan_output``, ``terminal``); the only folder that prints or exits.

May import every other folder; nothing but ``nan_hunter.__main__`` imports it. ``app`` and
``main`` are re-exported, lazily (so that ``cli/terminal.py`` stays light), for the console script
``nan_hunter.cli:main`` and ``from nan_hunter.cli import app``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["app", "main"]

if TYPE_CHECKING:
    from nan_hunter.cli.commands import app, main


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nan_hunter.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
