"""Check that the built sdist and wheel hold every file nan-hunter needs at run time.

    python .ci/check_dist.py DIST_DIR

The wheel must hold every module of the source tree, ``py.typed``, the JSON report schema and
every file of the top-level ``configs/`` folder under ``nan_hunter/configs/``; the sdist must hold
the same sources plus what building and testing need (setup files, configs, examples, tests).
Prints the counts; exits 1 naming what is missing.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: str, pattern: str = "*") -> set[str]:
    base = ROOT / folder
    return {
        p.relative_to(ROOT).as_posix()
        for p in base.rglob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    }


def expected_wheel() -> set[str]:
    modules = _files("nan_hunter", "*.py")
    data = {"nan_hunter/py.typed"} | _files("nan_hunter/report", "*.json")
    configs = {"nan_hunter/" + name for name in _files("configs")}
    return modules | data | configs


def expected_sdist() -> set[str]:
    top = {"README.md", "pyproject.toml", "setup.py", "MANIFEST.in", ".pre-commit-hooks.yaml"}
    return (
        top
        | _files("nan_hunter", "*.py")
        | _files("configs")
        | _files("docs")
        | _files("examples", "*.py")
        | _files("tests", "*.py")
        | _files("tests/golden")
    )


def main(dist: Path) -> int:
    wheels = sorted(dist.glob("nan_hunter-*.whl"))
    sdists = sorted(dist.glob("nan_hunter-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"check_dist: expected one wheel and one sdist in {dist}, got {wheels + sdists}")
        return 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        in_wheel = set(wheel.namelist())
    with tarfile.open(sdists[0]) as sdist:
        prefix = sdists[0].name.removesuffix(".tar.gz") + "/"
        in_sdist = {m.name.removeprefix(prefix) for m in sdist.getmembers() if m.isfile()}
    failed = False
    for name, expected, found in (
        (wheels[0].name, expected_wheel(), in_wheel),
        (sdists[0].name, expected_sdist(), in_sdist),
    ):
        missing = sorted(expected - found)
        print(f"check_dist: {name}: {len(found)} files, {len(expected)} required, "
              f"{len(missing)} missing")
        for path in missing:
            print(f"  missing: {path}")
        failed = failed or bool(missing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
