"""Settings: ``configs/default.yaml``, then the project's file (``nan_hunter.project.discovery``),
then ``--config FILE``, then command-line flags.

YAML is read with ``safe_load``; an unknown key or a value of the wrong type or choice is a
``ConfigError`` naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nan_hunter.errors import ConfigError
from nan_hunter.project.choices import SETTING_CHOICES
from nan_hunter.project.resources import default_config_file

DEFAULT_CONFIG = default_config_file()

PYPROJECT = "pyproject.toml"
TABLE = "nan-hunter"
"""The ``[tool.nan-hunter]`` table of a ``pyproject.toml``."""


@dataclass(frozen=True)
class ProjectConfig:
    """Settings found in a project file (``nan_hunter.project.discovery`` finds it): the file and
    its raw key/value pairs."""

    path: Path
    values: Mapping[str, Any]

    @property
    def label(self) -> str:
        """The file as a setting's source: ``/path/pyproject.toml [tool.nan-hunter]``."""
        suffix = f" [tool.{TABLE}]" if self.path.name == PYPROJECT else ""
        return f"{self.path}{suffix}"

GRADSCALER_INIT_SCALE = 65536.0
"""``torch.amp.GradScaler``'s default ``init_scale`` (2**16)."""
DYNAMIC = "dynamic"
"""``grad_scale: dynamic``: GradScaler's default policy (2**16, backed off on overflow)."""

_SHARES = frozenset({"underflow_share", "grad_underflow_share"})
_CHOICES: dict[str, tuple[str, ...]] = {
    key: tuple(member.value for member in choices) for key, choices in SETTING_CHOICES.items()
}


@dataclass(frozen=True)
class Settings:
    dtype: str = "float16"
    device: str = "auto"
    mode: str = "autocast"
    policy: str = "cuda"
    numerics: str = "emulated"
    backward: bool = True
    underflow_share: float = 0.25
    underflow_min_count: int = 16
    max_warnings: int = 20
    upstream_depth: int = 12
    grad_scale: float | str | None = "dynamic"
    """Loss scale for the backward, as GradScaler applies it: ``"dynamic"`` (the default:
    GradScaler's default policy, initial scale 2**16, halved after each step whose gradients
    overflow; see ``nan_hunter.precision.loss_scale.back_off``), a fixed number, or None (no
    loss scaling)."""
    grad_underflow_share: float = 0.25
    min_headroom: float = 0.0
    """NH503: warn about a forward value within this factor of the format's largest value
    (8: |x| above 65504 / 8 = 8188 in FP16); 0 turns the check off."""
    precision_check: str = "auto"
    """Compare each op, the loss and the gradients with an FP32 run (NH6xx): ``auto`` (only
    with ``dtype: bfloat16``, whose problem is precision, not range), ``on``, ``off``."""
    precision_jump: float = 16.0
    """NH602/NH609: an op's error against FP32 must exceed its inputs' error plus one rounding
    of the format (2**-8 BF16, 2**-11 FP16) this many times."""
    accumulation_length: int = 4096
    """NH603: a sum/cumsum/prod in low precision over at least this many values."""
    verify_fixes: bool = True
    fix_device: str = "policy"
    """The ``device_type`` of a fix's ``torch.autocast(..., enabled=False)``: ``policy``, the
    device the policy predicts (``"cuda"``); ``input``, the device of a tensor entering the
    region (``device_type=x.device.type``: the same line works on a GPU and a CPU), the device
    scanned on where no input can be named (``nan-hunter run``'s default)."""
    lr: float = 1e-3
    """Adam learning rate for ``--steps``."""
    select: tuple[str, ...] = ("NH",)
    ignore: tuple[str, ...] = ()
    fail_on: str = "error"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each setting came from: ``"default"``, a config file's path, or ``"cli"``."""

    @property
    def dynamic_scale(self) -> bool:
        return self.grad_scale == DYNAMIC

    def loss_scale(self) -> float:
        """The loss scale the backward starts from: 1 without loss scaling; with ``dynamic``,
        GradScaler's initial 2**16 (the engine backs off from it when gradients overflow)."""
        if self.grad_scale is None:
            return 1.0
        if isinstance(self.grad_scale, str):
            return GRADSCALER_INIT_SCALE
        return float(self.grad_scale)

    @property
    def checks_precision(self) -> bool:
        """Whether the scan compares its ops with an FP32 run (``precision_check``)."""
        if self.precision_check == "auto":
            return self.dtype == "bfloat16"
        return self.precision_check == "on"

    def rule_enabled(self, code: str) -> bool:
        selected = any(code.startswith(prefix) for prefix in self.select)
        ignored = any(code.startswith(prefix) for prefix in self.ignore)
        return selected and not ignored

    def resolved_device(self) -> str:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for, but CUDA is not available here")
        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def predicts_another_device(self) -> bool:
        """The scan predicts a run on a device it does not run on (CUDA, on a CPU)."""
        return self.policy not in ("native", self.resolved_device())


_FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "sources"}


def _coerce(key: str, value: Any, origin: str) -> Any:
    if key == "grad_scale":
        return _grad_scale(value, origin)
    default = getattr(Settings(), key)
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{origin}: '{key}' must be a list of rule codes")
        codes = tuple(v.strip().upper() for v in value)
        for code in codes:
            _check_selector(code, key, origin)
        return codes
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{origin}: '{key}' must be true or false, got {_short(value)}")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(
                f"{origin}: '{key}' must be a number, got {_short(value)}"
            )
        if not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{origin}: '{key}' must be a finite number >= 0, got {_short(value)}"
            )
        if isinstance(default, int) and value != int(value):
            raise ConfigError(f"{origin}: '{key}' must be a whole number, got {_short(value)}")
        if key in _SHARES and value > 1:
            raise ConfigError(f"{origin}: '{key}' is a share between 0 and 1, got {_short(value)}")
        return type(default)(value)
    if not isinstance(value, str):
        raise ConfigError(f"{origin}: '{key}' must be a string, got {_short(value)}")
    choices = _CHOICES.get(key)
    if choices and value not in choices:
        raise ConfigError(
            f"{origin}: '{key}' must be one of {', '.join(choices)}, got {_short(value)}"
        )
    return value


def known_codes() -> frozenset[str]:
    """Every rule code, read from the rule modules' names (``rules/nh101_*.py``, or ``.pyc`` in
    an install without sources): no torch import, so that options are checked before any model
    code runs (a test keeps it equal to the registry)."""
    from importlib.resources import files

    folder = files("nan_hunter").joinpath("rules")
    return frozenset(
        match.group(1).upper()
        for entry in folder.iterdir()
        if (match := re.fullmatch(r"(nh\d{3})_\w+\.pyc?", entry.name))
    )


def _check_selector(code: str, key: str, origin: str) -> None:
    """A selector is a rule code or a prefix of one (``NH``, ``NH1``, ``NH101``): anything else
    would silently select nothing (``--select NX101`` reporting a clean model)."""
    if not any(known.startswith(code) for known in known_codes()) or not code:
        shown = code if len(code) <= 20 else code[:20] + "..."
        raise ConfigError(
            f"{origin}: '{key}' has an unknown rule code {shown!r} (codes and prefixes of "
            "`nan-hunter rules`, e.g. NH1 or NH101)"
        )


def _grad_scale(value: Any, origin: str) -> float | str | None:
    """``none``, ``dynamic``, a positive number, or a power of two written ``2**16``/``2^16``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, str) and value.strip().lower() == DYNAMIC:
        return DYNAMIC
    scale = float("nan")
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        base, sep, exponent = text.replace("^", "**").partition("**")
        try:
            scale = float(base) ** float(exponent) if sep else float(text)
        except (ValueError, OverflowError):
            scale = float("nan")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        scale = float(value)
    if not math.isfinite(scale) or scale <= 0:
        raise ConfigError(
            f"{origin}: 'grad_scale' must be none, dynamic or a positive number (65536, 2**16), "
            f"got {_short(value)}"
        )
    return scale


MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 10_000
"""Values in a config once YAML aliases are expanded (an alias bomb expands to billions)."""
MAX_CONFIG_DEPTH = 32


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        if path.is_dir():
            raise ConfigError(f"config file {path} is a folder")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.start}: "
            f"{raw[exc.start:exc.start + 1]!r})"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"config file {path}: {exc}; keep one") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    _check_size(data, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return data


class _DuplicateKey(Exception):
    """A mapping of a YAML file gives one key twice (``yaml.safe_load`` keeps the last)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: a second
    ``fail_on:`` further down must not silently override the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # a merge key (<<) may repeat what it merges; lists are not keys
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(
                    f"key {_short(key)} is given twice (lines {seen[key]} and {line})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "..."


def _check_size(data: Any, path: Path) -> None:
    """Walk the loaded data once, counting every value as if aliases were expanded, and stop
    early: a YAML alias bomb is refused in microseconds instead of formatted for minutes."""
    count = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"config file {path} holds more than {MAX_CONFIG_VALUES} values once its YAML "
                "aliases are expanded (an alias bomb?)"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"config file {path} is nested more than {MAX_CONFIG_DEPTH} deep")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _short(value: Any) -> str:
    """A value for a message: never the whole of a huge one."""
    return reprlib.repr(value)


def _merge(values: dict[str, Any], sources: dict[str, str], data: Mapping[str, Any], origin: str,
           label: str) -> None:
    for key, value in data.items():
        if key not in _FIELDS:
            known = ", ".join(sorted(_FIELDS))
            raise ConfigError(f"{origin}: unknown key {_short(key)} (known keys: {known})")
        values[key] = _coerce(key, value, origin)
        sources[key] = label


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML settings file as a mapping (checked against the keys when merged)."""
    return _read_yaml(path)


def load_settings(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    project: ProjectConfig | None = None,
) -> Settings:
    """Defaults, then the ``project`` settings (a discovered ``pyproject.toml`` or
    ``nan-hunter.yaml``), then ``config_file``, then ``overrides`` (None entries are skipped)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    _merge(values, sources, _read_yaml(DEFAULT_CONFIG), str(DEFAULT_CONFIG), "default")
    if project is not None:
        _merge(values, sources, project.values, project.label, project.label)
    if config_file is not None:
        _merge(values, sources, _read_yaml(config_file), str(config_file), str(config_file))
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    _merge(values, sources, cli, "command line", "cli")
    settings = Settings(**values, sources=sources)
    _check_selection(settings)
    return settings


def _check_selection(settings: Settings) -> None:
    """A selection that leaves no rule (``select = []``, ``ignore = ["NH"]``, ``--select NH1
    --ignore NH1``) would report every model clean: refused, naming where it came from."""
    if any(settings.rule_enabled(code) for code in known_codes()):
        return
    keys = ["select", *(["ignore"] if settings.ignore else [])]
    origins = [_origin(settings.sources.get(key, "default")) for key in keys]
    named = [o for o in origins if o != str(DEFAULT_CONFIG)] or origins
    given = " with ".join(f"'{key}' [{', '.join(getattr(settings, key))}]" for key in keys)
    raise ConfigError(
        f"{' and '.join(dict.fromkeys(named))}: {given} leaves no rule to run (codes and "
        "prefixes of `nan-hunter rules`, e.g. NH or NH1)"
    )


def _origin(label: str) -> str:
    """A setting's source (``Settings.sources``) as a message names it."""
    return {"default": str(DEFAULT_CONFIG), "cli": "command line"}.get(label, label)
