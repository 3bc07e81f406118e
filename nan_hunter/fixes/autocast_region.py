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

This module lays the region out and writes it; where it may go is ``fixes.statements``, which
operands get ``.float()`` is ``fixes.operands``, and which names hold Python numbers (never cast)
is ``fixes.python_numbers``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

from nan_hunter.findings import Edit
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.operands import (
    ATOMIC_OPERANDS,
    TextEdit,
    an_input,
    apply_text_edits,
    binary_operator,
    dtype_of_an_input,
    find_op_node,
    outermost_binops,
    upcast_edits,
    upcast_operand,
)
from nan_hunter.fixes.python_numbers import python_numbers
from nan_hunter.fixes.source_file import (
    SourceError,
    SourcePositions,
    compiles,
    decode_source,
    split_lines,
)
from nan_hunter.fixes.statements import (
    SIMPLE_STATEMENTS,
    assigned_names,
    contains,
    ends_line,
    has_torch_import,
    import_bindings,
    import_insert_index,
    leading_indent,
    locate,
    producer_statement_lines,
    region_start,
    stmt_start,
)

__all__ = ["RegionPatch", "build_autocast_region_patch"]

INDENT_UNIT = "    "
_DEVICE_TYPE = re.compile(r"[A-Za-z0-9_:.\-]+")


@dataclass(frozen=True)
class RegionPatch:
    """A planned autocast-disabled region, as a diff and as the whole patched file."""

    diff: str  # unified diff, paths "a/<relpath>" and "b/<relpath>", rendered from ``edits``
    new_source: str  # whole patched file text
    edits: tuple[Edit, ...]  # whole-line edits of the decoded text (BOM excluded)
    first_line: int  # 1-based first line of the wrapped region in the ORIGINAL file
    last_line: int  # 1-based last line of the wrapped region in the ORIGINAL file


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
    device_from_input: bool = False,
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
    With ``device_from_input`` the region names the device of a tensor entering it
    (``device_type=q.device.type``: the autocast of the device the code runs on, GPU or CPU,
    is switched off) and ``device_type`` only when no input can be named.

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
        device_from_input,
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
    device_from_input: bool = False,
) -> tuple[str, int, int] | None:
    """The patched text and the region's original first and last line, or ``None``."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    source = SourcePositions(text)
    located = locate(tree.body, culprit_line)
    if located is None or not isinstance(located.stmt, SIMPLE_STATEMENTS):
        return None
    if located.in_fp32_region and cast_back is None:
        return None  # never a region inside a region (a later --fix-all round re-wrapping)
    if grow_to_producers:
        producer_lines = [*producer_lines, *producer_statement_lines(located, producer_lines,
                                                                      tree.body)]
    first_index = region_start(source, located, tree.body, producer_lines)
    if first_index is None:
        return None
    first_stmt = located.block[first_index]
    first_line = stmt_start(first_stmt)
    last_index = located.index
    for line in consumer_lines:  # statements after the culprit that still need FP32
        consumer = locate(tree.body, line)
        if consumer is not None and consumer.block is located.block:
            last_index = max(last_index, consumer.index)
    if last_index != located.index and not ends_line(source, located.block[last_index]):
        last_index = located.index
    last_line = located.block[last_index].end_lineno
    assert last_line is not None
    interior = string_interior_lines(source.lines)
    if interior is None:
        return None
    region = located.block[first_index : last_index + 1]
    sites = [
        site for site in upcast_sites
        if binary_operator(site[1]) is not None or not site[1].endswith("__")
    ]
    site_stmts = [s for s in region if any(contains(s, line) for line, _, _ in sites)]
    torch_names = import_bindings(tree)[1]
    # In half mode an op inside a module's forward (a Linear called as self.fc(x)) cannot be
    # given FP32 inputs from here: its weights stay FP16. Its result is upcast instead.
    by_name = cast_back is None
    region_ops = [
        node
        for line, op, _ in sites
        for stmt in region
        if contains(stmt, line)
        and (node := find_op_node(stmt, line, op, torch_names, by_name)) is not None
    ]

    def inside(stmt: ast.stmt) -> set[str]:
        """Names that upcast statements before ``stmt`` in the region (the culprit's among
        them) assigned: FP32 there."""
        upcast = [*site_stmts, located.stmt] if located.stmt not in site_stmts else site_stmts
        earlier = [s for s in upcast if s is not stmt and s.lineno < stmt.lineno]
        return {name for s in earlier for name in assigned_names(s)}

    edits = upcast_edits(
        source, tree, located.stmt, culprit_line, op_name, n_tensor_operands,
        inside=inside(located.stmt), uncast_operands=uncast_operands, region_ops=region_ops,
        fallback=by_name,
    )
    if edits is None:
        return None
    for site_line, site_op, site_n in sites:
        stmt = next((s for s in region if contains(s, site_line)), None)
        extra = (
            upcast_edits(
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
        fp32_names = assigned_names(located.stmt)
        for stmt in located.block[located.index + 1 : last_index + 1]:
            for node in outermost_binops(stmt):
                for operand in (node.left, node.right):
                    start, end = source.span(operand)
                    if any(start <= e.start <= end for e in edits):
                        continue  # a cast planned inside it already
                    edits.extend(upcast_operand(
                        source, operand, fp32_names, numbers, torch_names, fp32_modules=False
                    ))
            fp32_names = fp32_names | assigned_names(stmt)
    # The cast back follows the model's dtype rather than naming it: an input the region
    # upcast, still holding its value at the end (``.to(h.dtype)``), is FP16 under
    # ``model.half()`` and FP32 in an FP32 run of the same code (the re-scan's reference pass,
    # an evaluation in FP32); without such an input, the dtype itself.
    back = cast_back
    if cast_back is not None:
        back = dtype_of_an_input(source, located.block[first_index : last_index + 1], edits)
        back = cast_back if back is None else back
    last_stmt = located.block[last_index]
    brought_back_elsewhere = any(
        (consumer := locate(tree.body, line)) is None or consumer.block is not located.block
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
        # list lands first (``apply_text_edits``): the parenthesis opening goes last, its closing
        # first, so both enclose the operands' own casts.
        value = last_stmt.value
        start, end = source.span(value)
        if isinstance(value, ATOMIC_OPERANDS):
            edits = [TextEdit(end, end, f".to({back})"), *edits]
        else:
            edits = [TextEdit(end, end, f").to({back})"), *edits, TextEdit(start, start, "(")]
    lines = split_lines(apply_text_edits(text, edits))
    if len(lines) != len(source.lines):
        return None
    indent = leading_indent(source, first_stmt)
    if cast_back is not None:
        # Half mode: no autocast to switch off. The region's inputs are upcast; the values it
        # hands on are cast back to the model's dtype where it ends.
        # Where the values leave this block (a module's forward returning them to its parent),
        # the cast back goes after the consumer statement in the parent that brings them back
        # into range.
        newline = newline_of(source.lines)
        rest = located.block[last_index + 1 :]
        casts_after = [(last_line, indent, _cast_back_names(region, rest), back)]
        for line in consumer_lines:
            consumer = locate(tree.body, line)
            if consumer is None or consumer.block is located.block:
                continue
            end = consumer.stmt.end_lineno
            assert end is not None
            later = consumer.block[consumer.index + 1 :]
            casts_after.append(
                (end, leading_indent(source, consumer.stmt),
                 _cast_back_names([consumer.stmt], later), cast_back)  # another scope
            )
        for after, at_indent, live, to in sorted(casts_after, key=lambda c: c[0], reverse=True):
            casts = "".join(f"{at_indent}{name} = {name}.to({to}){newline}" for name in live)
            if casts:
                insert_line(lines, after, casts, newline)
        return "".join(lines), first_line, last_line
    unit = "\t" if "\t" in indent else INDENT_UNIT
    newline = newline_of(source.lines)
    for lineno in range(first_line, last_line + 1):
        if lineno not in interior and lines[lineno - 1].strip():
            lines[lineno - 1] = unit + lines[lineno - 1]
    named = an_input(source, region, edits) if device_from_input else None
    device = f"{named}.device.type" if named is not None else f'"{device_type}"'
    header = f"{indent}with torch.autocast(device_type={device}, enabled=False):{newline}"
    insertions = [(first_line - 1, header)]
    if not has_torch_import(tree.body, first_line, located.in_function):
        at = import_insert_index(tree.body, source, first_line, located.in_function)
        insertions.append((at, f"import torch{newline}"))
    for index, new_line in sorted(insertions, key=lambda item: item[0], reverse=True):
        insert_line(lines, index, new_line, newline)
    return "".join(lines), first_line, last_line


# --- reading, lines, compiling, diffing --------------------------------------------------------


def newline_of(lines: Sequence[str]) -> str:
    for line in lines:
        stripped = line.rstrip("\r\n")
        if stripped != line:
            return line[len(stripped) :]
    return "\n"


def _cast_back_names(stmts: Sequence[ast.stmt], later: Sequence[ast.stmt]) -> list[str]:
    """Names that ``stmts`` assign and the statements ``later`` in the same block read."""
    used_later = {n.id for s in later for n in ast.walk(s) if isinstance(n, ast.Name)}
    return sorted({n for s in stmts for n in assigned_names(s)} & used_later)


def insert_line(lines: list[str], index: int, new_line: str, newline: str) -> None:
    """Insert ``new_line`` before ``lines[index]``, ending the line above it if needed."""
    if index > 0 and not lines[index - 1].endswith(("\n", "\r")):
        lines[index - 1] += newline
    lines.insert(index, new_line)


def string_interior_lines(lines: list[str]) -> set[int] | None:
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



