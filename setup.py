"""Packages for setuptools: everything under nan_hunter/, plus the top-level ``configs/`` folder
(default settings, autocast policy tables) mapped into the package as ``nan_hunter/configs``.

Users read and edit ``configs/`` at the top of the repository; the build copies it into the wheel,
so no symlink is needed and a non-editable install is complete. All other metadata is in
pyproject.toml.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {
    "nan_hunter.configs": "configs",
    "nan_hunter.configs.policies": "configs/policies",
}

setup(
    packages=[*find_packages(include=["nan_hunter", "nan_hunter.*"]), *DATA_PACKAGES],
    package_dir=DATA_PACKAGES,
)
