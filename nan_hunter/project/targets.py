"""The model files of a run: paths as given, folders expanded to the files that define the model.

A folder stands for every ``.py`` file below it (sorted; hidden folders, ``__pycache__`` and
virtual environments skipped) that defines the model function at its top level (``def
build_model``, an assignment, or an import under that name; an import only with the batch
function bound too, so that a test module importing ``build_model`` is not a model file). A
file that does not parse is kept when it mentions the name, so its error is reported rather
than skipped. A file path or a ``pkg.module`` spec is kept as given.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from nan_hunter.errors import LoadError

_SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages"})


def expand_paths(paths: Iterable[str], model_fn: str, batch_fn: str | None = None) -> list[str]:
    """The files to scan, in order, without duplicates. ``batch_fn``: the batch function a
    file that imports the model function must bind too (None with a saved batch)."""
    files: list[str] = []
    for raw in paths:
        path = Path(raw)
        if visible(path, Path.is_dir):
            found = [str(p) for p in _python_files(path) if defines(p, model_fn, batch_fn)]
            if not found:
                raise LoadError(f"{raw}: no .py file below this folder defines {model_fn}()")
            files.extend(found)
        else:
            files.append(raw)
    return list(dict.fromkeys(files))


def check_model_file(spec: str) -> None:
    """Raises the ``LoadError`` that says why the model file ``spec`` cannot be imported: a
    folder, missing, or a path the system cannot look at (a name too long, a folder the user
    may not enter). The CLI asks before it starts a scan process (which imports torch only to
    say so), the loader before it imports the file."""
    path = Path(spec)
    try:
        folder, found = path.is_dir(), path.is_file()
    except OSError as exc:
        raise LoadError(f"cannot read model file {spec}: {exc.strerror or exc}") from None
    if folder:
        raise LoadError(
            f"{spec} is a folder, not a model file: name the .py file (or a pkg.module)"
        )
    if not found:
        raise LoadError(f"model file not found: {spec}")


def visible(path: Path, test: Callable[[Path], bool] = Path.exists) -> bool:
    """``test(path)`` (``Path.exists``, ``Path.is_dir``); False where the system cannot look
    (a name too long, a folder the user may not enter): the path is kept as given, and its
    scan says why it cannot be read."""
    try:
        return test(path)
    except OSError:
        return False


def _python_files(folder: Path) -> Iterator[Path]:
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_dir():
            if entry.name.startswith(".") or entry.name in _SKIPPED_FOLDERS:
                continue
            if (entry / "pyvenv.cfg").is_file():  # a virtual environment
                continue
            yield from _python_files(entry)
        elif entry.suffix == ".py" and entry.is_file():
            yield entry


def defines(path: Path, name: str, batch_fn: str | None = None) -> bool:
    """Whether the module at ``path`` binds ``name`` at its top level: by its own definition,
    or by an import when it binds ``batch_fn`` too (or ``batch_fn`` is None)."""
    try:
        source = path.read_bytes()
    except OSError:
        return False
    try:
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError):
        return name.encode() in source
    bound = set().union(*(_bound_names(node) for node in tree.body))
    if name not in bound:
        return False
    own = set().union(*(_bound_names(node, imports=False) for node in tree.body))
    return batch_fn is None or name in own or batch_fn in bound


def _bound_names(node: ast.stmt, *, imports: bool = True) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names} if imports else set()
    if isinstance(node, (ast.If, ast.Try)):
        inner = [*node.body, *node.orelse]
        if isinstance(node, ast.Try):
            inner += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
        return set().union(*(_bound_names(s, imports=imports) for s in inner)) if inner else set()
    return set()
