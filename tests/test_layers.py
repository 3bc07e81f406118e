"""The package's folders import only what the table allows, and no module imports itself back.

The table (``FOLDERS``, the same as in docs/architecture.md) names each folder, what it holds and
the folders it may import; ``EXCEPTIONS`` names the few modules allowed one more folder, with
the reason. Every ``import`` statement counts, at module level and inside functions alike (a
lazy import is still a dependency, and usually one that hides a cycle); only imports under
``if TYPE_CHECKING:`` are left out, since they never run. Imports by name at run time
(``importlib.import_module``) are not edges of the graph; the ones the package has are listed in
``IMPORTS_BY_NAME`` with their reason, and a new one fails ``test_imports_by_name_are_known``.

Names in the tables are relative to the package: ``engine`` is the folder ``nan_hunter/engine/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nan_hunter"

FOLDERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (folder, the modules it holds, the folders it may import), bottom first; a module may
    # always import its own folder (without a cycle)
    ("errors", ("errors", "version"), ()),
    ("core", ("core",), ("errors",)),
    ("project", ("project",), ("errors", "core")),
    ("precision/trace", ("precision", "trace"), ("errors", "core", "project")),
    ("findings", ("findings",), ("errors", "core", "precision/trace")),
    ("engine", ("engine",), ("errors", "core", "project", "precision/trace", "findings")),
    ("rules", ("rules",), ("errors", "core", "project", "precision/trace", "findings", "engine")),
    ("fixes", ("fixes",), (
        "errors", "core", "project", "precision/trace", "findings", "engine", "rules",
    )),
    ("report", ("report",), (
        "errors", "core", "project", "precision/trace", "findings", "fixes",
    )),
    ("api", ("api",), ("errors", "core", "project", "findings", "engine", "fixes", "report")),
    ("training", ("training",), (
        "errors", "core", "project", "precision/trace", "findings", "engine", "fixes", "report",
        "api",
    )),
    ("integrations", ("integrations",), (
        "errors", "core", "findings", "engine", "report", "api", "training",
    )),
    ("process", ("process",), (
        "errors", "core", "project", "findings", "fixes", "report", "api", "training",
    )),
    ("facade", ("", "watch", "pytest_plugin"), ("errors", "report", "api", "training")),
    ("cli", ("cli", "__main__"), (
        "errors", "core", "project", "findings", "fixes", "report", "process",
    )),
)

EXCEPTIONS: dict[tuple[str, str], str] = {
    # (module, folder it may import as well): why
    ("engine.scan", "rules"): "the scan runs the rules on the evidence its passes gathered",
    ("engine.scan", "fixes"): "the scan builds each finding's fix",
    ("project.loader", "precision/trace"): (
        "the user's file is imported under the device alias, and the trace's call-site filter "
        "learns its folder"
    ),
    ("project.loader", "process"): (
        "process.activity notes which user code runs, for the scan process's crash message"
    ),
    ("project.suppressions", "findings"): "suppressions filter a Report's findings",
}

IMPORTS_BY_NAME = {
    # the rule registry imports every rules/nh*.py module of its own package (discovery)
    ("nan_hunter.rules.registry", "f'{__package__}.{module.name}'"),
    # the user's model, named on the command line, and its patched copy during verification
    ("nan_hunter.project.loader", "spec"),
    ("nan_hunter.fixes.in_memory", "name"),
    # a reproduction bundle's model.py names the modules its classes come from
    ("nan_hunter.training.repro_load", "name"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str:
    """The module of ours that ``name`` (a module, or a name imported from one) lives in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def imports_of(module: str) -> set[str]:
    """Our modules that ``module`` imports anywhere in its file (TYPE_CHECKING blocks aside)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(_owner(a.name) for a in node.names if a.name.startswith("nan_hunter"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
            if not base.startswith("nan_hunter"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else _owner(base))
    found.discard(module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def _relative(module: str) -> str:
    return module.removeprefix("nan_hunter").removeprefix(".")


def folder_of(module: str) -> str:
    """The row of ``FOLDERS`` that holds ``module`` (a full name: ``nan_hunter.engine.scan``)."""
    name = _relative(module)
    best = None
    for folder, holds, _ in FOLDERS:
        for prefix in holds:
            # the package itself (the facade in __init__) is its own entry, not a prefix
            inside = bool(prefix) and name.startswith(prefix + ".")
            if (name == prefix or inside) and (best is None or len(prefix) > best[1]):
                best = (folder, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no folder: add it to FOLDERS in {__file__}")
    return best[0]


ALLOWED = {folder: set(may) for folder, _, may in FOLDERS}


def allowed(module: str, target: str) -> bool:
    """Whether ``module`` may import ``target`` (both full names)."""
    mine, theirs = folder_of(module), folder_of(target)
    if theirs == mine or theirs in ALLOWED[mine]:
        return True
    name = _relative(module)
    return any(
        theirs == folder and (name == owner or name.startswith(owner + "."))
        for owner, folder in EXCEPTIONS
    )


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_every_module_has_a_folder() -> None:
    for module in MODULES:
        folder_of(module)


def test_the_table_names_known_folders_and_points_down() -> None:
    # each folder may import only folders listed above it in FOLDERS: the table has no cycle
    seen: set[str] = set()
    for folder, _, may in FOLDERS:
        assert set(may) <= seen, f"{folder} may import {sorted(set(may) - seen)}, not below it"
        seen.add(folder)
    for (module, folder), reason in EXCEPTIONS.items():
        assert folder in seen and reason
        assert f"nan_hunter.{module}" in MODULES, f"{module} in EXCEPTIONS no longer exists"


def test_docs_hold_the_same_table() -> None:
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([\w/]+) \| ((?:`[\w/]+`(?:, )?)+) \|([^|\n]*)\|$", text, re.M)
    documented = tuple(
        (folder, tuple(re.findall(r"`([\w/]+)`", holds)), tuple(re.findall(r"[\w/]+", may)))
        for folder, holds, may in rows
    )
    written = tuple((f, tuple(h or "__init__" for h in holds), m) for f, holds, m in FOLDERS)
    assert documented == written


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_folders_import_only_what_the_table_allows() -> None:
    forbidden = [
        f"{module} ({folder_of(module)}) imports {target} ({folder_of(target)})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if not allowed(module, target)
    ]
    assert forbidden == []


def test_the_root_holds_only_the_entry_points_and_the_public_types() -> None:
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= 8, root
    assert root == sorted([
        "__init__", "__main__", "api", "errors", "findings", "pytest_plugin", "version", "watch",
    ])


def test_the_checks_catch_a_cycle_and_a_forbidden_import() -> None:
    # the walker sees lazy imports inside functions, and the cycle finder closes the loop
    assert "nan_hunter.report.text" in GRAPH["nan_hunter.cli.commands"]  # inside `rules`
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert allowed("nan_hunter.report.text", "nan_hunter.findings")
    assert not allowed("nan_hunter.core.batch", "nan_hunter.engine.runner")
    assert not allowed("nan_hunter.report.text", "nan_hunter.engine.runner")
    assert not allowed("nan_hunter.engine.runner", "nan_hunter.rules.registry")
    assert allowed("nan_hunter.engine.scan", "nan_hunter.rules.registry")  # an exception
    assert not allowed("nan_hunter.project.config", "nan_hunter.trace.tracer")
    assert folder_of("nan_hunter") == "facade"
    assert folder_of("nan_hunter.core.range_map") == "core"
    with pytest.raises(AssertionError, match="in no folder"):
        folder_of("elsewhere")


def test_imports_by_name_are_known() -> None:
    found = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "import_module", "__import__",
            ):
                found.add((module, ast.unparse(node.args[0])))
    assert found == IMPORTS_BY_NAME
