"""Settings given by name to a Python entry point (``scan``, ``watch``, the callbacks).

One normaliser for all of them: names are checked against the settings, ``torch.float16`` is
taken for ``"float16"`` and any sequence of rule codes for a list, and a bad value fails when the
call is made (not at the first problem of a training run) with the caller's name in the message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from nan_hunter.errors import ConfigError
from nan_hunter.project.config import Settings, load_settings

OPTION_NAMES = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "sources")


def normalise_options(options: dict[str, Any], caller: str) -> dict[str, Any]:
    """Unknown names are an error; torch dtypes and sequences of codes are taken as such."""
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if name not in OPTION_NAMES:
            raise ConfigError(
                f"{caller}: unknown option {name!r} (known options: "
                f"{', '.join(sorted(OPTION_NAMES))})"
            )
        checked[name] = _value(value)
    return checked


def _value(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def settings_with(
    settings: Settings | None,
    options: dict[str, Any],
    caller: str,
    config_file: Path | None = None,
) -> Settings:
    """``settings`` (or the defaults and ``config_file``) with ``options`` applied on top; each
    option's source is recorded as ``"api"``."""
    checked = normalise_options(options, caller)
    try:
        given = load_settings(None if settings is not None else config_file, checked)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("command line: "):
            message = f"{caller}: " + message.removeprefix("command line: ")
        raise ConfigError(message) from None
    changed = {k for k, v in checked.items() if v is not None}
    base = given if settings is None else settings
    sources = {**base.sources, **dict.fromkeys(changed, "api")}
    return dataclasses.replace(
        base, **{k: getattr(given, k) for k in changed}, sources=sources
    )


def explicitly_set(settings: Settings, name: str) -> bool:
    """True when ``name`` was set by a config file, a flag or an option, not left at its default
    (in a ``Settings`` built by hand, without sources: when it differs from the default)."""
    source = settings.sources.get(name)
    if source is None:
        return bool(getattr(settings, name) != getattr(Settings(), name))
    return source != "default"
