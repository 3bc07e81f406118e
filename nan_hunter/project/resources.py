"""Where the shipped data lives: the default settings and the autocast policy tables.

The files are edited in the repository's top-level ``configs/`` folder; the build maps that folder
into the package as ``nan_hunter/configs`` (``package_dir`` in ``setup.py``), so a wheel or sdist
install reads them from inside the installed package. A source checkout (an editable install, or
the tests run from a clone) has no ``nan_hunter/configs`` and reads the top-level folder instead.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from nan_hunter.errors import ConfigError

_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """The folder holding ``default.yaml`` and ``policies/``."""
    packaged = resources.files("nan_hunter") / "configs"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = _PACKAGE_ROOT.parent / "configs"
    if (checkout / "default.yaml").is_file():
        return checkout
    raise ConfigError(
        f"nan-hunter's data files are missing: neither {packaged} nor {checkout} exists "
        "(a broken install; reinstall nan-hunter)"
    )


def default_config_file() -> Path:
    return config_dir() / "default.yaml"


def policy_dir() -> Path:
    return config_dir() / "policies"
