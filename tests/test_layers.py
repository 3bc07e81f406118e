"""The package's layers point down only, and no module imports itself back (docs/architecture.md).

Every ``import`` statement counts, at module level and inside functions alike (a lazy import
is still a dependency, and usually one that hides a cycle); only imports under
``if TYPE_CHECKING:`` are left out, since they never run. Imports by name at run time
(``importlib.import_module``) are not edges of the graph; the ones the package has are listed in
``IMPORTS_BY_NAME`` with their reason, and a new one fails ``test_imports_by_name_are_known``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nan_hunter"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # bottom first; a module may import its own layer (without a cycle) and the layers below
    ("base", (
        "nan_hunter.version", "nan_hunter.errors", "nan_hunter.project.resources", "nan_hunter.core.nest",
        "nan_hunter.process.activity", "nan_hunter.core.progress", "nan_hunter.cli.terminal",
        "nan_hunter.core.location", "nan_hunter.project.paths", "nan_hunter.core.batch",
        "nan_hunter.project.config", "nan_hunter.project.options", "nan_hunter.project.discovery",
        "nan_hunter.project.targets", "nan_hunter.core.safe_write", "nan_hunter.project.choices",
        "nan_hunter.core.untrusted", "nan_hunter.core.shared_patch", "nan_hunter.process.descendants",
        "nan_hunter.core.spikes",
    )),
    ("precision/trace", ("nan_hunter.precision", "nan_hunter.trace")),
    ("load/run", (
        "nan_hunter.project.loader", "nan_hunter.engine.model_state", "nan_hunter.engine.blame",
        "nan_hunter.engine.pass_state", "nan_hunter.engine.pass_retry", "nan_hunter.engine.traced_forward",
        "nan_hunter.engine.runner",
    )),
    ("results", ("nan_hunter.core.range_map", "nan_hunter.findings", "nan_hunter.project.suppressions")),
    ("analysis", (
        "nan_hunter.engine.candidate", "nan_hunter.engine.analysis", "nan_hunter.engine.range_map",
        "nan_hunter.engine.precision_loss",
    )),
    ("rules", ("nan_hunter.rules",)),
    ("fixes", ("nan_hunter.fixes",)),
    ("report", ("nan_hunter.report",)),
    ("engine", ("nan_hunter.engine.scan", "nan_hunter.process.worker", "nan_hunter.process.isolation")),
    ("api", (
        "nan_hunter.api", "nan_hunter.training", "nan_hunter.watch",
        "nan_hunter.integrations", "nan_hunter.pytest_plugin",
    )),
    ("command line", (
        "nan_hunter.cli.options", "nan_hunter.cli.output", "nan_hunter.cli.scan_output",
        "nan_hunter.cli.scan_command",
        "nan_hunter.process.scan_process", "nan_hunter.process.script_process", "nan_hunter.cli.run_command",
    )),
    ("cli", ("nan_hunter.cli", "nan_hunter.__main__", "nan_hunter")),
)

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


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # the package itself (the facade in __init__) is its own entry, not a prefix
            inside = module.startswith(prefix + ".") and prefix != "nan_hunter"
            if (module == prefix or inside) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best[0]


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


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_layers_import_only_downwards() -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
        f"({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    # the walker sees lazy imports inside functions, and the cycle finder closes the loop
    assert "nan_hunter.report.text" in GRAPH["nan_hunter.cli"]  # inside the rules command
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("nan_hunter.report.text") > layer_of("nan_hunter.findings")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("elsewhere")


def test_imports_by_name_are_known() -> None:
    found = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "import_module", "__import__",
            ):
                found.add((module, ast.unparse(node.args[0])))
    assert found == IMPORTS_BY_NAME
