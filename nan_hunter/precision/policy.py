"""Autocast policies as data: which aten ops autocast casts down, up, promotes or bans.

The tables live in ``configs/policies/<device>.yaml``; they are the lists of PyTorch's
``autocast_mode.cpp`` and are checked against the dispatcher in the tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

import yaml

from nan_hunter.errors import ConfigError
from nan_hunter.project.resources import policy_dir


class Cast(str, enum.Enum):
    LOWER = "lower_precision"
    FP32 = "fp32"
    FP32_UNLESS_DTYPE = "fp32_unless_dtype"
    PROMOTE = "promote"
    BANNED = "banned"


@dataclass(frozen=True)
class Policy:
    device: str
    dtypes: tuple[str, ...]
    casts: dict[str, Cast]
    """aten op name (without overload) -> what autocast does with its inputs."""

    def cast_of(self, op: str) -> Cast | None:
        return self.casts.get(op)

    def ops(self, cast: Cast) -> list[str]:
        return sorted(name for name, c in self.casts.items() if c is cast)


@cache
def load_policy(device: str) -> Policy:
    folder = policy_dir()
    path = folder / f"{device}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ConfigError(f"no autocast policy table for device {device!r} (known: {known})")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    casts: dict[str, Cast] = {}
    for cast in Cast:
        for name in data.get(cast.value) or []:
            if name in casts:
                raise ConfigError(f"{path}: op {name!r} is listed under two casts")
            casts[name] = cast
    return Policy(device=data["device"], dtypes=tuple(data["dtypes"]), casts=casts)
