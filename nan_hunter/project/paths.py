"""The user's project: its root folder, and whether a file belongs to it.

Patch paths are relative to the project root (the git top level when there is one, else the
working directory), so that ``git apply`` and ``patch -p1`` take them from there. Files of
installed packages, the standard library and torch are never the project's, even when a
virtual environment lives inside the project folder.
"""

from __future__ import annotations

import os
import site
import sysconfig
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path


def real_path(file: str) -> str:
    """``os.path.realpath(file)``, the folders' resolution cached: a scan looks at the file of
    every imported module (about 1,400 with torch, in about 150 folders), and ``realpath``
    checks every component of every path. A file that is itself a link, or a path with a
    ``..`` (which must follow the links before it), is resolved whole."""
    if os.path.islink(file) or os.pardir in file.split(os.sep):
        # a ".." after a linked folder leaves the link's target: only realpath knows where
        return os.path.realpath(file)
    folder, name = os.path.split(os.path.join(os.getcwd(), file))
    return os.path.join(_real_folder(folder), name)


@lru_cache(maxsize=4096)
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def project_root(file: Path, cwd: Path | None = None) -> Path:
    """The git top level above ``file``; else ``cwd`` when ``file`` is below it; else the
    file's own folder."""
    file = file.resolve()
    for folder in file.parents:
        if (folder / ".git").exists():
            return folder
    here = (cwd or Path.cwd()).resolve()
    if file.is_relative_to(here):
        return here
    return file.parent


def shared_root(files: Sequence[Path], cwd: Path | None = None) -> Path:
    """The project root of the first of ``files`` (``project_root``), widened to the folder
    all of them share when one lies outside it: in a project without git, scanned from one of
    its folders (``proj/scripts``), a fix may edit a file of a sibling package
    (``proj/mylib/layers.py``); the verification's mirror and the patch take in both."""
    root = project_root(files[0], cwd)
    resolved = [f.resolve() for f in files]
    if all(f.is_relative_to(root) for f in resolved):
        return root
    return Path(os.path.commonpath([str(root), *(str(f) for f in resolved)]))


@lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    roots = {str(Path(p).resolve()) for p in paths if p}
    return tuple(sorted(roots))


@lru_cache(maxsize=8192)
def is_installed(file: str) -> bool:
    """``file`` belongs to the interpreter, the standard library or an installed package
    (``site-packages``), not to a user's project."""
    if file.startswith("<"):
        return True
    try:
        resolved = real_path(file)
    except OSError:
        return False
    if "site-packages" in Path(resolved).parts or "dist-packages" in Path(resolved).parts:
        return True
    roots = _installed_roots()
    return any(resolved == r or resolved.startswith(r.rstrip("/") + "/") for r in roots)


def in_project(file: str, root: Path) -> bool:
    if is_installed(file):
        return False
    try:
        return Path(file).resolve().is_relative_to(root.resolve())
    except OSError:
        return False
