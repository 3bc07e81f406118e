"""Wrap a culprit statement in an autocast-disabled region, upcasting the culprit op to FP32.

Given the user's file, the line of the op call where FP16 broke, and optionally the lines of the
ops that produced an out-of-range FP32 operand of it, :func:`build_autocast_region_patch` plans
an edit like::

    with torch.autocast(device_type="cuda", enabled=False):
        dtd_inv = torch.inverse(dtd + self.lam * torch.eye(dtd.shape[0]))
        codes = torch.matmul(dtd_inv.float(), z.float())

The edit is made textually on the decoded source (positions come from :mod:`ast`; their column
offsets are UTF-8 byte offsets), so comments and formatting elsewhere are kept. Lines inside
multi-line string literals are never re-indented. The result is returned as whole-line edits
(and the unified diff rendered from them, which ``git apply`` and ``patch -p1`` accept), together
with the whole patched text. Whenever the edit cannot be made safely (unparsable file, culprit in
a compound-statement header, a lambda or a comprehension, statements sharing the region's lines,
a culprit already inside an autocast-disabled region, patched text that does not compile, ...)
the function returns ``None`` instead. In half mode (``cast_back``) no autocast region is
opened: the region's inputs are upcast and the values it hands on are cast back.
"""

from __future__ import annotations

import ast
import pathlib
import re
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from nan_hunter.findings import Edit
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.source_file import (
    SourceError,
    SourcePositions,
    compiles,
    decode_source,
    dotted_name,
    split_lines,
)

__all__ = ["RegionPatch", "build_autocast_region_patch"]

_SIMPLE_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)
_DEFERRED_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_ATOMIC_OPERANDS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call)
_NOT_TENSORS = (
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.JoinedStr,
    *_DEFERRED_SCOPES,
)
_UPCAST_METHODS = frozenset({"float", "double"})
_BINARY_OPERATORS: dict[str, tuple[type[ast.operator], str]] = {
    "matmul": (ast.MatMult, "@"),
    "mul": (ast.Mult, "*"),
    "truediv": (ast.Div, "/"),
    "add": (ast.Add, "+"),
    "sub": (ast.Sub, "-"),
    "pow": (ast.Pow, "**"),
}
_INDENT_UNIT = "    "
_DEVICE_TYPE = re.compile(r"[A-Za-z0-9_:.\-]+")
_SHEBANG_OR_CODING = re.compile(r"#!|[ \t\f]*#.*coding[:=]")


@dataclass(frozen=True)
class RegionPatch:
    """A planned autocast-disabled region, as a diff and as the whole patched file."""

    diff: str  # unified diff, paths "a/<relpath>" and "b/<relpath>", rendered from ``edits``
    new_source: str  # whole patched file text
    edits: tuple[Edit, ...]  # whole-line edits of the decoded text (BOM excluded)
    first_line: int  # 1-based first line of the wrapped region in the ORIGINAL file
    last_line: int  # 1-based last line of the wrapped region in the ORIGINAL file


@dataclass(frozen=True)
class _Located:
    """The innermost statement containing a line, with the statement list it lives in."""

    stmt: ast.stmt
    block: list[ast.stmt]
    index: int
    in_function: bool
    in_fp32_region: bool = False
    """Inside a ``with torch.autocast(..., enabled=False)`` already (a region a fix made)."""


@dataclass(frozen=True)
class _Edit:
    """Replace ``text[start:end]`` with ``replacement`` (character offsets)."""

    start: int
    end: int
    replacement: str


def build_autocast_region_patch(
    path: pathlib.Path,
    culprit_line: int,
    op_name: str,
    n_tensor_operands: int,
    producer_lines: Sequence[int] = (),
    device_type: str = "cuda",
    relative_to: pathlib.Path | None = None,
    upcast_sites: Sequence[tuple[int, str, int]] = (),
    uncast_operands: frozenset[int] = frozenset(),
    consumer_lines: Sequence[int] = (),
    cast_back: str | None = None,
    grow_to_producers: bool = False,
) -> RegionPatch | None:
    """Plan an edit wrapping the culprit statement in ``torch.autocast(..., enabled=False)``.

    ``culprit_line`` is the 1-based line of the op call ``op_name`` (a user-level name such as
    ``"torch.matmul"``, ``"Tensor.__matmul__"`` or ``"Tensor.softmax"``); its first
    ``n_tensor_operands`` positional operands (0 = unknown) get ``.float()`` appended. The region
    is extended backwards over the directly preceding statements of the same block up to the
    earliest one containing a line of ``producer_lines``; producer lines elsewhere are ignored.
    Diff paths are relative to ``relative_to`` (default: ``path.parent``). ``upcast_sites`` are
    further ``(line, op_name, n_tensor_operands)`` ops inside the region whose operands are
    upcast as well (an eps addition upstream of the culprit); sites outside it are ignored.

    Returns ``None`` when no safe edit can be made. Raises ``ValueError`` when ``path`` is not
    inside ``relative_to`` or ``device_type`` is not a plain device name, and ``OSError`` when the
    file cannot be read.
    """
    if not _DEVICE_TYPE.fullmatch(device_type):
        raise ValueError(f"not a device type: {device_type!r}")
    base = relative_to if relative_to is not None else path.parent
    path.absolute().relative_to(base.absolute())  # ValueError when outside
    try:
        source = decode_source(path, path.read_bytes())
    except SourceError:
        return None
    bom = "\ufeff" if source.bom else ""
    original = bom + source.text
    patched = _patch_text(
        original[len(bom) :],
        culprit_line,
        op_name,
        max(n_tensor_operands, 0),
        producer_lines,
        device_type,
        upcast_sites,
        uncast_operands,
        consumer_lines,
        cast_back,
        grow_to_producers,
    )
    if patched is None:
        return None
    new_text, first_line, last_line = patched
    if not compiles(new_text, str(path)):
        return None
    edits = edits_between(path, original[len(bom) :], new_text)
    diff = render_diff(edits, base)
    return RegionPatch(
        diff=diff, new_source=bom + new_text, edits=edits, first_line=first_line,
        last_line=last_line,
    )


def _patch_text(
    text: str,
    culprit_line: int,
    op_name: str,
    n_tensor_operands: int,
    producer_lines: Sequence[int],
    device_type: str,
    upcast_sites: Sequence[tuple[int, str, int]] = (),
    uncast_operands: frozenset[int] = frozenset(),
    consumer_lines: Sequence[int] = (),
    cast_back: str | None = None,
    grow_to_producers: bool = False,
) -> tuple[str, int, int] | None:
    """The patched text and the region's original first and last line, or ``None``."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    source = SourcePositions(text)
    located = _locate(tree.body, culprit_line)
    if located is None or not isinstance(located.stmt, _SIMPLE_STATEMENTS):
        return None
    if located.in_fp32_region and cast_back is None:
        return None  # never a region inside a region (a later --fix-all round re-wrapping)
    if grow_to_producers:
        producer_lines = [*producer_lines, *_producer_statement_lines(located, producer_lines,
                                                                      tree.body)]
    first_index = _region_start(source, located, tree.body, producer_lines)
    if first_index is None:
        return None
    first_stmt = located.block[first_index]
    first_line = _stmt_start(first_stmt)
    last_index = located.index
    for line in consumer_lines:  # statements after the culprit that still need FP32
        consumer = _locate(tree.body, line)
        if consumer is not None and consumer.block is located.block:
            last_index = max(last_index, consumer.index)
    if last_index != located.index and not _ends_line(source, located.block[last_index]):
        last_index = located.index
    last_line = located.block[last_index].end_lineno
    assert last_line is not None
    interior = _string_interior_lines(source.lines)
    if interior is None:
        return None
    region = located.block[first_index : last_index + 1]
    sites = [
        site for site in upcast_sites
        if _binary_operator(site[1]) is not None or not site[1].endswith("__")
    ]
    site_stmts = [s for s in region if any(_contains(s, line) for line, _, _ in sites)]
    torch_names = _import_bindings(tree)[1]
    # In half mode an op inside a module's forward (a Linear called as self.fc(x)) cannot be
    # given FP32 inputs from here: its weights stay FP16. Its result is upcast instead.
    by_name = cast_back is None
    region_ops = [
        node
        for line, op, _ in sites
        for stmt in region
        if _contains(stmt, line)
        and (node := _find_op_node(stmt, line, op, torch_names, by_name)) is not None
    ]

    def inside(stmt: ast.stmt) -> set[str]:
        """Names that upcast statements before ``stmt`` in the region (the culprit's among
        them) assigned: FP32 there."""
        upcast = [*site_stmts, located.stmt] if located.stmt not in site_stmts else site_stmts
        earlier = [s for s in upcast if s is not stmt and s.lineno < stmt.lineno]
        return {name for s in earlier for name in _assigned_names(s)}

    edits = _upcast_edits(
        source, tree, located.stmt, culprit_line, op_name, n_tensor_operands,
        inside=inside(located.stmt), uncast_operands=uncast_operands, region_ops=region_ops,
        fallback=by_name,
    )
    if edits is None:
        return None
    for site_line, site_op, site_n in sites:
        stmt = next((s for s in region if _contains(s, site_line)), None)
        extra = (
            _upcast_edits(
                source, tree, stmt, site_line, site_op, site_n, inside=inside(stmt),
                region_ops=region_ops, fallback=by_name,
            )
            if stmt else None
        )
        edits.extend(e for e in extra or () if e not in edits)
    if cast_back is not None:
        # Half mode: the statements after the culprit's, down to the one that brings the
        # values back, compute with its FP32 result; an FP16 operand meeting it in a matmul
        # (``s.softmax(-1) @ v``) fails. The operands of their arithmetic get FP32 leaves
        # too, where no cast is planned inside them already.
        numbers = dict.fromkeys(python_numbers(tree, culprit_line), True)
        fp32_names = _assigned_names(located.stmt)
        for stmt in located.block[located.index + 1 : last_index + 1]:
            for node in _outermost_binops(stmt):
                for operand in (node.left, node.right):
                    start, end = source.span(operand)
                    if any(start <= e.start <= end for e in edits):
                        continue  # a cast planned inside it already
                    edits.extend(_upcast_operand(
                        source, operand, fp32_names, numbers, torch_names, fp32_modules=False
                    ))
            fp32_names = fp32_names | _assigned_names(stmt)
    # The cast back follows the model's dtype rather than naming it: an input the region
    # upcast, still holding its value at the end (``.to(h.dtype)``), is FP16 under
    # ``model.half()`` and FP32 in an FP32 run of the same code (the re-scan's reference pass,
    # an evaluation in FP32); without such an input, the dtype itself.
    back = cast_back
    if cast_back is not None:
        back = _dtype_of_an_input(source, located.block[first_index : last_index + 1], edits)
        back = cast_back if back is None else back
    last_stmt = located.block[last_index]
    brought_back_elsewhere = any(
        (consumer := _locate(tree.body, line)) is None or consumer.block is not located.block
        for line in consumer_lines
    )
    if (
        cast_back is not None and isinstance(last_stmt, ast.Return) and last_stmt.value
        and not brought_back_elsewhere
    ):
        # Half mode, a region that ends in ``return`` with its values back in range: the value
        # it hands on is the returned one, cast back there (no name to cast back after the
        # block). A value still out of range is cast back where its consumer in the caller
        # brings it back (below), never here. Of two insertions at one offset the later in the
        # list lands first (``_apply_edits``): the parenthesis opening goes last, its closing
        # first, so both enclose the operands' own casts.
        value = last_stmt.value
        start, end = source.span(value)
        if isinstance(value, _ATOMIC_OPERANDS):
            edits = [_Edit(end, end, f".to({back})"), *edits]
        else:
            edits = [_Edit(end, end, f").to({back})"), *edits, _Edit(start, start, "(")]
    lines = split_lines(_apply_edits(text, edits))
    if len(lines) != len(source.lines):
        return None
    indent = _leading_indent(source, first_stmt)
    if cast_back is not None:
        # Half mode: no autocast to switch off. The region's inputs are upcast; the values it
        # hands on are cast back to the model's dtype where it ends.
        # Where the values leave this block (a module's forward returning them to its parent),
        # the cast back goes after the consumer statement in the parent that brings them back
        # into range.
        newline = _newline_of(source.lines)
        rest = located.block[last_index + 1 :]
        casts_after = [(last_line, indent, _cast_back_names(region, rest), back)]
        for line in consumer_lines:
            consumer = _locate(tree.body, line)
            if consumer is None or consumer.block is located.block:
                continue
            end = consumer.stmt.end_lineno
            assert end is not None
            later = consumer.block[consumer.index + 1 :]
            casts_after.append(
                (end, _leading_indent(source, consumer.stmt),
                 _cast_back_names([consumer.stmt], later), cast_back)  # another scope
            )
        for after, at_indent, live, to in sorted(casts_after, key=lambda c: c[0], reverse=True):
            casts = "".join(f"{at_indent}{name} = {name}.to({to}){newline}" for name in live)
            if casts:
                _insert_line(lines, after, casts, newline)
        return "".join(lines), first_line, last_line
    unit = "\t" if "\t" in indent else _INDENT_UNIT
    newline = _newline_of(source.lines)
    for lineno in range(first_line, last_line + 1):
        if lineno not in interior and lines[lineno - 1].strip():
            lines[lineno - 1] = unit + lines[lineno - 1]
    header = f'{indent}with torch.autocast(device_type="{device_type}", enabled=False):{newline}'
    insertions = [(first_line - 1, header)]
    if not _has_torch_import(tree.body, first_line, located.in_function):
        at = _import_insert_index(tree.body, source, first_line, located.in_function)
        insertions.append((at, f"import torch{newline}"))
    for index, new_line in sorted(insertions, key=lambda item: item[0], reverse=True):
        _insert_line(lines, index, new_line, newline)
    return "".join(lines), first_line, last_line


# --- reading, lines, compiling, diffing --------------------------------------------------------


def _newline_of(lines: Sequence[str]) -> str:
    for line in lines:
        stripped = line.rstrip("\r\n")
        if stripped != line:
            return line[len(stripped) :]
    return "\n"


def _cast_back_names(stmts: Sequence[ast.stmt], later: Sequence[ast.stmt]) -> list[str]:
    """Names that ``stmts`` assign and the statements ``later`` in the same block read."""
    used_later = {n.id for s in later for n in ast.walk(s) if isinstance(n, ast.Name)}
    return sorted({n for s in stmts for n in _assigned_names(s)} & used_later)


def _insert_line(lines: list[str], index: int, new_line: str, newline: str) -> None:
    """Insert ``new_line`` before ``lines[index]``, ending the line above it if needed."""
    if index > 0 and not lines[index - 1].endswith(("\n", "\r")):
        lines[index - 1] += newline
    lines.insert(index, new_line)


def _string_interior_lines(lines: list[str]) -> set[int] | None:
    """1-based lines that start inside a multi-line string literal (never re-indented)."""
    interior: set[int] = set()
    opened: list[int] = []
    starts = {getattr(tokenize, name, None) for name in ("FSTRING_START", "TSTRING_START")}
    ends = {getattr(tokenize, name, None) for name in ("FSTRING_END", "TSTRING_END")}
    starts.discard(None)
    ends.discard(None)
    try:
        for token in tokenize.generate_tokens(iter(lines).__next__):
            if token.type == tokenize.STRING:
                interior.update(range(token.start[0] + 1, token.end[0] + 1))
            elif token.type in starts:
                opened.append(token.start[0])
            elif token.type in ends and opened:
                interior.update(range(opened.pop() + 1, token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return interior


def _apply_edits(text: str, edits: list[_Edit]) -> str:
    """Apply non-overlapping edits right-to-left."""
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    return text


# --- locating the culprit statement and the region ---------------------------------------------


def _stmt_start(stmt: ast.stmt) -> int:
    """First line of a statement, counting its decorators."""
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def _contains(stmt: ast.stmt, line: int) -> bool:
    assert stmt.end_lineno is not None
    return _stmt_start(stmt) <= line <= stmt.end_lineno


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


def _locate(body: list[ast.stmt], line: int) -> _Located | None:
    """The innermost statement containing ``line``; ``None`` if none or ambiguous."""
    block = body
    in_function = False
    in_region = False
    while True:
        hits = [i for i, stmt in enumerate(block) if _contains(stmt, line)]
        if len(hits) != 1:
            return None
        stmt = block[hits[0]]
        inner = next(
            (lst for lst in _statement_lists(stmt) if any(_contains(s, line) for s in lst)),
            None,
        )
        if inner is None:
            return _Located(stmt, block, hits[0], in_function, in_region)
        in_function = in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
        in_region = in_region or _is_autocast_off(stmt)
        block = inner


def _is_autocast_off(stmt: ast.stmt) -> bool:
    """``with torch.autocast(..., enabled=False):`` (or ``torch.cuda.amp.autocast``)."""
    if not isinstance(stmt, (ast.With, ast.AsyncWith)):
        return False
    for item in stmt.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and _func_last_name(call.func) == "autocast":
            for keyword in call.keywords:
                if (
                    keyword.arg == "enabled"
                    and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value is False
                ):
                    return True
    return False


def _region_start(
    source: SourcePositions,
    located: _Located,
    module_body: list[ast.stmt],
    producer_lines: Sequence[int],
) -> int | None:
    """Index in the culprit's block of the region's first statement, or ``None``."""
    start = located.index
    for line in producer_lines:
        producer = _locate(module_body, line)
        if producer is not None and producer.block is located.block:
            start = min(start, producer.index)
    while start < located.index and _is_unwrappable(located.block, start):
        start += 1
    if not _ends_line(source, located.stmt):
        return None
    for index in range(start, located.index + 1):
        if _starts_line(source, located.block[index]):
            return index
    return None


def _producer_statement_lines(
    located: _Located, producer_lines: Sequence[int], module_body: list[ast.stmt]
) -> list[int]:
    """Lines of the statements before the region, in its block, that assign the names the
    region reads (transitively): taking them in keeps the gradients flowing back into them in
    FP32, where a cast at the region's entry would overflow (NH401 at a dtype boundary)."""
    start = located.index
    for line in producer_lines:
        producer = _locate(module_body, line)
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
        if not isinstance(stmt, _SIMPLE_STATEMENTS) or not (_assigned_names(stmt) & needed):
            continue
        lines.append(_stmt_start(stmt))
        needed |= {
            n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
    return lines


def _is_unwrappable(block: list[ast.stmt], index: int) -> bool:
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


def _leading_indent(source: SourcePositions, stmt: ast.stmt) -> str:
    line = source.line(_stmt_start(stmt))
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def _starts_line(source: SourcePositions, stmt: ast.stmt) -> bool:
    """Nothing but indentation precedes the statement (or its decorators) on its first line."""
    if getattr(stmt, "decorator_list", None):
        return source.line(_stmt_start(stmt)).lstrip(" \t\f").startswith("@")
    before = source.line(stmt.lineno)[: source.char_col(stmt.lineno, stmt.col_offset)]
    return not before.strip(" \t\f")


def _ends_line(source: SourcePositions, stmt: ast.stmt) -> bool:
    """Nothing but whitespace or a comment follows the statement on its last line."""
    assert stmt.end_lineno is not None and stmt.end_col_offset is not None
    line = source.line(stmt.end_lineno)
    rest = line[source.char_col(stmt.end_lineno, stmt.end_col_offset) :].strip(" \t\f")
    return not rest or rest.startswith("#")


# --- imports -----------------------------------------------------------------------------------


def _visible_imports(
    body: list[ast.stmt], first_line: int, in_function: bool
) -> list[ast.Import | ast.ImportFrom]:
    """Module-level imports that have run when the region runs."""
    imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
    if in_function:
        return imports
    return [s for s in imports if s.end_lineno is not None and s.end_lineno < first_line]


def _has_torch_import(body: list[ast.stmt], first_line: int, in_function: bool) -> bool:
    for stmt in _visible_imports(body, first_line, in_function):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "torch" and alias.asname in (None, "torch"):
                    return True
                if alias.name.startswith("torch.") and alias.asname is None:
                    return True
    return False


def _import_insert_index(
    body: list[ast.stmt], source: SourcePositions, first_line: int, in_function: bool
) -> int:
    """0-based line index before which ``import torch`` goes."""
    imports = _visible_imports(body, first_line, in_function)
    if imports:
        return max(s.end_lineno or s.lineno for s in imports)
    if body and _is_unwrappable(body, 0) and isinstance(body[0], ast.Expr):
        return body[0].end_lineno or body[0].lineno
    index = 0
    while index < min(2, len(source.lines)) and _SHEBANG_OR_CODING.match(source.lines[index]):
        index += 1
    return index


def _import_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
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


# --- finding the op node -----------------------------------------------------------------------


def _walk(
    node: ast.AST, depth: int = 0, hidden: bool = False
) -> Iterator[tuple[ast.AST, int, bool]]:
    """Yield ``(node, depth, inside a lambda or comprehension)`` for a subtree."""
    yield node, depth, hidden
    hidden = hidden or isinstance(node, _DEFERRED_SCOPES)
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, depth + 1, hidden)


def _binary_operator(op_name: str) -> tuple[type[ast.operator], str] | None:
    """``Tensor.__rmatmul__`` -> ``(ast.MatMult, "@")``; ``None`` for non-operator ops."""
    last = op_name.rsplit(".", 1)[-1]
    if not (last.startswith("__") and last.endswith("__")):
        return None
    name = last[2:-2]
    if name in _BINARY_OPERATORS:
        return _BINARY_OPERATORS[name]
    if name[:1] in ("r", "i") and name[1:] in _BINARY_OPERATORS:
        return _BINARY_OPERATORS[name[1:]]
    return None


def _func_last_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _on_line(node: ast.AST, line: int) -> bool:
    """The node is anchored on ``line`` (its start, or a method call's attribute line)."""
    if getattr(node, "lineno", None) == line:
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.end_lineno == line
    )


def _spans(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    end = getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= line <= end


def _pick(candidates: list[tuple[ast.AST, int]], line: int, outermost: bool) -> ast.AST | None:
    """Prefer nodes anchored on ``line`` (first in source order), else the innermost spanning."""
    anchored = [(node, depth) for node, depth in candidates if _on_line(node, line)]
    if anchored:

        def order(item: tuple[ast.AST, int]) -> tuple[int, ...]:
            node, depth = item
            position = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
            return (depth, *position) if outermost else (*position, depth)

        return min(anchored, key=order)[0]
    if candidates:
        return max(candidates, key=lambda item: item[1])[0]
    return None


def _find_op_node(
    stmt: ast.stmt, line: int, op_name: str, torch_names: set[str], fallback: bool = True
) -> ast.AST | None:
    """The culprit op's node in ``stmt``; ``None`` if absent or only in a lambda/comprehension."""
    operator = _binary_operator(op_name)
    last = op_name.rsplit(".", 1)[-1]
    visible: list[tuple[ast.AST, int]] = []
    any_hidden = False
    for node, depth, hidden in _walk(stmt):
        if not _spans(node, line):
            continue
        if operator is not None:
            matches = isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(
                node.op, operator[0]
            )
        else:
            matches = isinstance(node, ast.Call) and _func_last_name(node.func) == last
        if matches and hidden:
            any_hidden = True
        elif matches:
            visible.append((node, depth))
    if visible:
        return _pick(visible, line, outermost=False)
    if any_hidden or not fallback:
        return None
    outer_calls = [
        (node, depth)
        for node, depth, hidden in _walk(stmt)
        if isinstance(node, ast.Call)
        and not hidden
        and _spans(node, line)
        and _root_name(node.func) not in torch_names
    ]
    return _pick(outer_calls, line, outermost=True)


# --- operand upcasts ---------------------------------------------------------------------------


def _is_upcast(expr: ast.expr) -> bool:
    """``expr`` already ends in ``.float()`` (or ``.double()``)."""
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in _UPCAST_METHODS
        and not expr.args
        and not expr.keywords
    )


def _is_constant(expr: ast.expr) -> bool:
    """A literal (``-1`` included) or a display that cannot be a tensor."""
    if isinstance(expr, ast.UnaryOp):
        return _is_constant(expr.operand)
    return isinstance(expr, _NOT_TENSORS)


def _dtype_of_an_input(
    source: SourcePositions, region: Sequence[ast.stmt], edits: Sequence[_Edit]
) -> str | None:
    """``"h.dtype"`` for the first name (or ``self`` attribute) the region upcasts
    (``h.float()``) that no statement of the region assigns; else for the input ``x`` of a
    module call the region upcasts (``self.fc(x).float()``: in a ``model.half()`` forward its
    input has the model's dtype); else ``None``."""
    upcast_at = {e.start for e in edits if e.start == e.end and e.replacement == ".float()"}
    assigned: set[str] = set()
    for stmt in region:
        for node in ast.walk(stmt):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
                targets = [node.target]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets = [node.optional_vars]
            assigned.update(d for t in targets for n in ast.walk(t) if (d := dotted_name(n)))
    for stmt in region:
        for node in ast.walk(stmt):
            name = dotted_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name is None or name.count(".") > 1 or name in assigned:
                continue
            if "." in name and not name.startswith("self."):
                continue
            if source.span(node)[1] in upcast_at:
                return f"{name}.dtype"
    for stmt in region:  # else the input of a module the region calls upcast: ``self.fc(x)``
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)
                and (called := dotted_name(node.func)) is not None and called.startswith("self.")
                and source.span(node)[1] in upcast_at and node.args[0].id not in assigned
            ):
                return f"{node.args[0].id}.dtype"
    return None


def _assigned_names(stmt: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _upcast_operand(
    source: SourcePositions,
    expr: ast.expr,
    inside: AbstractSet[str] = frozenset(),
    numbers: Mapping[str, bool] | None = None,
    torch_names: AbstractSet[str] = frozenset({"torch"}),
    fp32_modules: bool = False,
) -> list[_Edit]:
    """Edits that make ``expr`` compute in FP32 from its leaves; none if not needed: already
    upcast, a constant, a Python number, or made only of names the region computed in FP32.

    A cast on a sub-expression's result would leave the sub-expression itself in FP16
    (``torch.sqrt(s + eps)`` adds ``eps`` in FP16 even with autocast off), so the casts go on
    the leaves it is computed from: through arithmetic, through a tensor method's receiver
    (``k.float().transpose(-2, -1)``), through an elementwise torch function's first argument.
    With ``fp32_modules`` (autocast mode, where a module's weights are FP32) a call of
    ``self.<name>(...)`` gets its first argument cast, since a module inside an autocast-off
    region cannot take FP16 inputs; otherwise (``model.half()``: FP16 weights) its result is
    cast. Any other call, a name, an attribute or a subscript is a leaf: ``.float()`` after it.
    """
    numbers = numbers or {}

    def leaves(e: ast.expr) -> list[_Edit]:
        if _is_upcast(e) or _is_constant(e) or isinstance(e, ast.Starred):
            return []
        if _is_number_expr(e, numbers):
            return []
        names = {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}
        if names and names <= inside and not any(isinstance(n, ast.Call) for n in ast.walk(e)):
            return []
        if isinstance(e, ast.BinOp):
            return [*leaves(e.left), *leaves(e.right)]
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub | ast.UAdd):
            return leaves(e.operand)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            receiver, method = e.func.value, e.func.attr
            root = _root_name(receiver)
            args = _positional(e)
            if root in torch_names:
                if method in _UNARY and args:
                    return leaves(args[0])
                if method in _BINARY and len(args) >= 2:
                    return [*leaves(args[0]), *leaves(args[1])]
            elif isinstance(receiver, ast.Name) and receiver.id == "self":
                if fp32_modules:
                    return leaves(args[0]) if args else []
            elif method not in _DTYPE_METHODS and method not in _VIEW_METHODS:
                return leaves(receiver)
        start, end = source.span(e)
        if isinstance(e, _ATOMIC_OPERANDS):
            return [_Edit(end, end, ".float()")]
        return [_Edit(start, start, "("), _Edit(end, end, ").float()")]

    return leaves(expr)


_UNARY = frozenset({
    "sqrt", "rsqrt", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "abs", "square",
    "pow", "tanh", "sigmoid", "softmax", "log_softmax", "sum", "mean", "var", "std", "norm",
    "amax", "amin", "clamp", "clamp_min", "clamp_max", "reciprocal", "neg", "cumsum", "sin",
    "cos", "erf", "gelu", "relu", "silu", "logsumexp",
})
"""torch functions whose first argument carries the values (``torch.sqrt(s + eps)``)."""
_BINARY = frozenset({
    "matmul", "mm", "bmm", "atan2", "add", "sub", "mul", "div", "maximum", "minimum", "hypot",
})
"""torch functions of two tensors (``torch.matmul(a, b)``)."""
_DTYPE_METHODS = frozenset({
    "to", "type", "half", "bfloat16", "int", "long", "bool", "short", "byte", "char", "item",
    "size", "dim", "numel", "tolist",
})
"""Tensor methods whose result's dtype is not the receiver's: cast after them, not before."""
_VIEW_METHODS = frozenset({
    "transpose", "t", "permute", "view", "reshape", "contiguous", "unsqueeze", "squeeze",
    "expand", "expand_as", "flatten", "narrow", "select", "chunk", "split", "unflatten",
    "detach", "clone",
})
"""Tensor methods that move values without computing: the same cast before or after, and
after reads as the code does (``k.transpose(-2, -1).float()``)."""


def _positional(call: ast.Call) -> list[ast.expr]:
    """Positional arguments up to the first ``*args`` (later positions are unknown)."""
    args: list[ast.expr] = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            break
        args.append(arg)
    return args


def _call_operands(call: ast.Call, n: int, method: bool) -> list[ast.expr]:
    args = _positional(call)
    if method:
        assert isinstance(call.func, ast.Attribute)
        return [call.func.value, *args[: max(n - 1, 0)]]
    if n:
        return args[:n]
    return [arg for arg in args if not _is_constant(arg)]


def _aug_assign_edits(
    source: SourcePositions, stmt: ast.AugAssign, symbol: str
) -> list[_Edit] | None:
    """``x @= w`` -> ``x = x.float() @ w.float()`` (an in-place op cannot hold FP32)."""
    target = stmt.target
    if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
        return None
    if target.lineno != target.end_lineno:
        return None
    _, target_end = source.span(target)
    value_start, _ = source.span(stmt.value)
    gap = source.text[target_end:value_start]
    at = gap.find(symbol + "=")
    if at < 0:
        return None
    start = target_end + at
    replacement = f"= {source.segment(target)}.float() {symbol}"
    value = stmt.value
    if isinstance(value, _ATOMIC_OPERANDS) or _is_constant(value):
        return [_Edit(start, start + len(symbol) + 1, replacement), *_upcast_operand(source, value)]
    # ``x *= w + 1`` -> ``x = x.float() * (w.float() + 1)``: the value keeps its precedence.
    # Of two insertions at one offset, the later one in this list lands before the earlier
    # (``_apply_edits``): the closing parenthesis comes before the leaves' edits and the
    # opening one after them, so both enclose whatever a leaf adds at the value's ends.
    value_start, value_end = source.span(value)
    return [
        _Edit(start, start + len(symbol) + 1, replacement),
        _Edit(value_end, value_end, ")"),
        *_upcast_operand(source, value),
        _Edit(value_start, value_start, "("),
    ]


def _upcast_edits(
    source: SourcePositions,
    tree: ast.Module,
    stmt: ast.stmt,
    line: int,
    op_name: str,
    n_tensor_operands: int,
    *,
    inside: AbstractSet[str] = frozenset(),
    uncast_operands: frozenset[int] = frozenset(),
    region_ops: Sequence[ast.AST] = (),
    fallback: bool = True,
) -> list[_Edit] | None:
    """Edits appending ``.float()`` to the op's tensor operands, or ``None``; operands known
    not to be low-precision floats (``uncast_operands``, by position: FP32 already, a bool
    mask, an int index, as the trace recorded their dtypes) or computed in the region are
    left."""
    module_names, torch_names = _import_bindings(tree)
    node = _find_op_node(stmt, line, op_name, torch_names, fallback)
    if node is None:
        return None
    if isinstance(node, ast.AugAssign):
        operator = _binary_operator(op_name)
        assert operator is not None
        return _aug_assign_edits(source, node, operator[1])
    if isinstance(node, ast.BinOp):
        operands = [node.left, node.right]
    else:
        assert isinstance(node, ast.Call)
        func = node.func
        matched = _func_last_name(func) == op_name.rsplit(".", 1)[-1]
        method = (
            matched
            and isinstance(func, ast.Attribute)
            and _root_name(func.value) not in module_names | torch_names
        )
        operands = _call_operands(node, n_tensor_operands, method)
    numbers = dict.fromkeys(python_numbers(tree, line), True)
    return [
        edit
        for i, operand in enumerate(operands)
        if i not in uncast_operands and not _holds_any(operand, region_ops)
        for edit in _upcast_operand(
            source, operand, inside, numbers, torch_names, fp32_modules=fallback
        )
    ]


_NUMBER_CALLS = frozenset({"float", "int", "len", "round", "abs", "min", "max"})
"""Builtins that give a Python number: always (``_NUMBER_OF_ANYTHING``), or when their arguments
are numbers (``abs(x)`` of a tensor is a tensor). ``math.*`` calls give numbers too."""
_NUMBER_OF_ANYTHING = frozenset({"float", "int", "len"})
_COUNT_METHODS = frozenset({"size", "dim", "numel", "item", "nelement", "ndimension"})
"""Tensor methods that give a Python number (``x.size(0)``: an int)."""


def python_numbers(tree: ast.Module, line: int) -> set[str]:
    """Names (``bsz``) and attributes (``self.scale``) that hold a Python number where ``line``
    runs, as far as the source says: assigned a number, an arithmetic of numbers, ``x.size(0)``,
    ``x.shape[-1]`` or ``len(x)`` in the function holding ``line``, at module level, or (an
    attribute of ``self``) anywhere in the class holding it, and never assigned anything else
    there. Never given ``.float()``: the trace sees their values among an op's scalars, not
    its tensors."""
    scopes: list[ast.AST] = [tree]
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            scopes.append(node)
    kinds: dict[str, bool] = {}
    parameters: set[str] = set()
    for scope in scopes:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg, default in _parameters_with_defaults(scope.args):
                if _is_number_parameter(arg, default):
                    kinds[arg.arg] = True
                else:
                    parameters.add(arg.arg)
    for scope in scopes:
        nodes = scope.body if isinstance(scope, ast.Module) else ast.walk(scope)
        for node in nodes:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            is_number = _is_number_expr(value, kinds)
            for target in targets:
                name = dotted_name(target)
                if name is not None and (isinstance(scope, ast.Module) or name.startswith(
                    "self.") or not isinstance(scope, ast.ClassDef)
                ):
                    kinds[name] = kinds.get(name, True) and is_number
    return {name for name, number in kinds.items() if number and name not in parameters}


def _parameters_with_defaults(
    arguments: ast.arguments,
) -> list[tuple[ast.arg, ast.expr | None]]:
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    pairs = list(zip(positional, [*defaults, *arguments.defaults], strict=True))
    return pairs + list(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))


def _is_number_parameter(arg: ast.arg, default: ast.expr | None) -> bool:
    """``eps=1e-5``, ``scale: float``: a parameter the signature says is a number."""
    annotation = arg.annotation
    if isinstance(annotation, ast.Name) and annotation.id in ("int", "float"):
        return True
    return default is not None and annotation is None and _is_number_expr(default, {})


def _is_number_expr(expr: ast.expr, known: Mapping[str, bool]) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
    if isinstance(expr, ast.UnaryOp):
        return _is_number_expr(expr.operand, known)
    if isinstance(expr, ast.BinOp):
        return _is_number_expr(expr.left, known) and _is_number_expr(expr.right, known)
    if isinstance(expr, ast.Subscript):  # x.shape[-1], x.size()[0]
        base = expr.value
        return (isinstance(base, ast.Attribute) and base.attr == "shape") or (
            isinstance(base, ast.Call) and _func_last_name(base.func) == "size"
        )
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "math":
                return True
            if func.attr in _COUNT_METHODS:
                return func.attr != "size" or bool(expr.args)  # x.size() is a torch.Size
            return False
        if isinstance(func, ast.Name) and func.id in _NUMBER_CALLS:
            return func.id in _NUMBER_OF_ANYTHING or all(
                _is_number_expr(a, known) for a in expr.args
            )
        return False
    name = dotted_name(expr)
    return name is not None and known.get(name, False)



def _outermost_binops(stmt: ast.stmt) -> list[ast.BinOp]:
    """The binary operations of ``stmt`` not inside another one, outside lambdas."""
    found: list[ast.BinOp] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.BinOp):
                found.append(child)
            elif not isinstance(child, _DEFERRED_SCOPES):
                visit(child)

    visit(stmt)
    return found


def _holds_any(expr: ast.expr, nodes: Sequence[ast.AST]) -> bool:
    """``expr`` is, or contains, the result of another op of the region (already FP32)."""
    inner = set(map(id, ast.walk(expr)))
    return any(id(node) in inner for node in nodes)
