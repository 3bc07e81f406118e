"""The settings that take one of a few names, declared once: the command line's choices, the
config file's checks and the API's all come from these."""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Mode(str, Enum):
    autocast = "autocast"
    half = "half"


class Policy(str, Enum):
    cuda = "cuda"
    cpu = "cpu"
    native = "native"


class Numerics(str, Enum):
    emulated = "emulated"
    real = "real"


class FixDevice(str, Enum):
    policy = "policy"
    input = "input"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"
    sarif = "sarif"
    github = "github"
    junit = "junit"


class PrecisionCheck(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


SETTING_CHOICES: dict[str, type[Enum]] = {
    "precision_check": PrecisionCheck,
    "dtype": DType,
    "device": Device,
    "mode": Mode,
    "policy": Policy,
    "numerics": Numerics,
    "fail_on": FailOn,
    "fix_device": FixDevice,
}
"""The setting each enum is the choices of (``Settings`` keeps the plain names)."""
