"""A file's statement structure for a region fix: the innermost statement holding a line and the
block it lives in, where a region may start and end, the statements producing its inputs, and
the imports a patch can rely on or has to add.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nan_hunter.fixes.source_file import SourcePositions, last_name

SIMPLE_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)


_SHEBANG_OR_CODING = re.compile(r"#!|[ \t\f]*#.*coding[:=]")


@dataclass(frozen=True)
class Located:
    """The innermost statement containing a line, with the statement list it lives in."""

    stmt: ast.stmt
    block: list[ast.stmt]
    index: int
    in_function: bool
    in_fp32_region: bool = False
    """Inside a ``with torch.autocast(..., enabled=False)`` already (a region a fix made)."""


def stmt_start(stmt: ast.stmt) -> int:
    """First line of a statement, counting its decorators."""
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def contains(stmt: ast.stmt, line: int) -> bool:
    assert stmt.end_lineno is not None
    return stmt_start(stmt) <= line <= stmt.end_lineno


def _statement_lists(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists nested directly in a compound statement (bodies, handlers, cases)."""
    for field in stmt._fields:
        value = getattr(stmt, field, None)
        if not isinstance(value, list) or not value:
            continue
        if all(isinstance(item, ast.stmt) for item in value):
            yield value
        for item in value:
            if isinstance(item, (ast.excepthandler, ast.match_case)):
                yield item.body


def locate(body: list[ast.stmt], line: int) -> Located | None:
    """The innermost statement containing ``line``; ``None`` if none or ambiguous."""
    block = body
    in_function = False
    in_region = False
    while True:
        hits = [i for i, stmt in enumerate(block) if contains(stmt, line)]
        if len(hits) != 1:
            return None
        stmt = block[hits[0]]
        inner = next(
            (lst for lst in _statement_lists(stmt) if any(contains(s, line) for s in lst)),
            None,
        )
        if inner is None:
            return Located(stmt, block, hits[0], in_function, in_region)
        in_function = in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
        in_region = in_region or is_autocast_off(stmt)
        block = inner


def is_autocast_off(stmt: ast.stmt) -> bool:
    """``with torch.autocast(..., enabled=False):`` (or ``torch.cuda.amp.autocast``)."""
    if not isinstance(stmt, (ast.With, ast.AsyncWith)):
        return False
    for item in stmt.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and last_name(call.func) == "autocast":
            for keyword in call.keywords:
                if (
                    keyword.arg == "enabled"
                    and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value is False
                ):
                    return True
    return False


def region_start(
    source: SourcePositions,
    located: Located,
    module_body: list[ast.stmt],
    producer_lines: Sequence[int],
) -> int | None:
    """Index in the culprit's block of the region's first statement, or ``None``."""
    start = located.index
    for line in producer_lines:
        producer = locate(module_body, line)
        if producer is not None and producer.block is located.block:
            start = min(start, producer.index)
    while start < located.index and is_unwrappable(located.block, start):
        start += 1
    if not ends_line(source, located.stmt):
        return None
    for index in range(start, located.index + 1):
        if starts_line(source, located.block[index]):
            return index
    return None


def producer_statement_lines(
    located: Located, producer_lines: Sequence[int], module_body: list[ast.stmt]
) -> list[int]:
    """Lines of the statements before the region, in its block, that assign the names the
    region reads (transitively): taking them in keeps the gradients flowing back into them in
    FP32, where a cast at the region's entry would overflow (NH401 at a dtype boundary)."""
    start = located.index
    for line in producer_lines:
        producer = locate(module_body, line)
        if producer is not None and producer.block is located.block:
            start = min(start, producer.index)
    block = located.block
    needed = {
        n.id for stmt in block[start : located.index + 1] for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    lines: list[int] = []
    for index in range(start - 1, -1, -1):
        stmt = block[index]
        if not isinstance(stmt, SIMPLE_STATEMENTS) or not (assigned_names(stmt) & needed):
            continue
        lines.append(stmt_start(stmt))
        needed |= {
            n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
    return lines


def is_unwrappable(block: list[ast.stmt], index: int) -> bool:
    """A docstring or a ``from __future__`` import must stay where it is."""
    stmt = block[index]
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
        return True
    return (
        index == 0
        and isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def leading_indent(source: SourcePositions, stmt: ast.stmt) -> str:
    line = source.line(stmt_start(stmt))
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def starts_line(source: SourcePositions, stmt: ast.stmt) -> bool:
    """Nothing but indentation precedes the statement (or its decorators) on its first line."""
    if getattr(stmt, "decorator_list", None):
        return source.line(stmt_start(stmt)).lstrip(" \t\f").startswith("@")
    before = source.line(stmt.lineno)[: source.char_col(stmt.lineno, stmt.col_offset)]
    return not before.strip(" \t\f")


def ends_line(source: SourcePositions, stmt: ast.stmt) -> bool:
    """Nothing but whitespace or a comment follows the statement on its last line."""
    assert stmt.end_lineno is not None and stmt.end_col_offset is not None
    line = source.line(stmt.end_lineno)
    rest = line[source.char_col(stmt.end_lineno, stmt.end_col_offset) :].strip(" \t\f")
    return not rest or rest.startswith("#")


def _visible_imports(
    body: list[ast.stmt], first_line: int, in_function: bool
) -> list[ast.Import | ast.ImportFrom]:
    """Module-level imports that have run when the region runs."""
    imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
    if in_function:
        return imports
    return [s for s in imports if s.end_lineno is not None and s.end_lineno < first_line]


def has_torch_import(body: list[ast.stmt], first_line: int, in_function: bool) -> bool:
    for stmt in _visible_imports(body, first_line, in_function):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "torch" and alias.asname in (None, "torch"):
                    return True
                if alias.name.startswith("torch.") and alias.asname is None:
                    return True
    return False


def import_insert_index(
    body: list[ast.stmt], source: SourcePositions, first_line: int, in_function: bool
) -> int:
    """0-based line index before which ``import torch`` goes."""
    imports = _visible_imports(body, first_line, in_function)
    if imports:
        return max(s.end_lineno or s.lineno for s in imports)
    if body and is_unwrappable(body, 0) and isinstance(body[0], ast.Expr):
        return body[0].end_lineno or body[0].lineno
    index = 0
    while index < min(2, len(source.lines)) and _SHEBANG_OR_CODING.match(source.lines[index]):
        index += 1
    return index


def import_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound by imports anywhere: ``(all of them, those bound to torch modules)``."""
    names: set[str] = set()
    torch_names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                names.add(bound)
                if alias.name == "torch" or alias.name.startswith("torch."):
                    torch_names.add(bound)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                bound = alias.asname or alias.name
                names.add(bound)
                if node.level == 0 and (module == "torch" or module.startswith("torch.")):
                    torch_names.add(bound)
    return names, torch_names


def assigned_names(stmt: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
