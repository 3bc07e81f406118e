"""The culprit op inside its statement and the ``.float()`` casts its operands get: the op's node
(an operator, a call, a method), which operands are FP16 tensors by the trace's evidence, and
the text edits that upcast them at their leaves (never a Python number).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from nan_hunter.fixes.python_numbers import is_number_expr, python_numbers
from nan_hunter.fixes.source_file import SourcePositions, dotted_name, last_name
from nan_hunter.fixes.statements import import_bindings

DEFERRED_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


ATOMIC_OPERANDS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call)


_NOT_TENSORS = (
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.JoinedStr,
    *DEFERRED_SCOPES,
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


@dataclass(frozen=True)
class TextEdit:
    """Replace ``text[start:end]`` with ``replacement`` (character offsets)."""

    start: int
    end: int
    replacement: str


def apply_text_edits(text: str, edits: Sequence[TextEdit]) -> str:
    """``text`` with non-overlapping ``edits`` applied, right to left. Of two insertions at one
    offset the later in the list lands first in the text: a closing ``).to(...)`` listed
    before an operand's ``.float()`` ends after it, an opening ``(`` listed after it before
    it."""
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    return text


def _walk(
    node: ast.AST, depth: int = 0, hidden: bool = False
) -> Iterator[tuple[ast.AST, int, bool]]:
    """Yield ``(node, depth, inside a lambda or comprehension)`` for a subtree."""
    yield node, depth, hidden
    hidden = hidden or isinstance(node, DEFERRED_SCOPES)
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, depth + 1, hidden)


def binary_operator(op_name: str) -> tuple[type[ast.operator], str] | None:
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


def root_name(expr: ast.expr) -> str | None:
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


def find_op_node(
    stmt: ast.stmt, line: int, op_name: str, torch_names: set[str], fallback: bool = True
) -> ast.AST | None:
    """The culprit op's node in ``stmt``; ``None`` if absent or only in a lambda/comprehension."""
    operator = binary_operator(op_name)
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
            matches = isinstance(node, ast.Call) and last_name(node.func) == last
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
        and root_name(node.func) not in torch_names
    ]
    return _pick(outer_calls, line, outermost=True)


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


def dtype_of_an_input(
    source: SourcePositions, region: Sequence[ast.stmt], edits: Sequence[TextEdit]
) -> str | None:
    """``"h.dtype"`` for ``an_input`` ``h`` of the region; else ``None``."""
    name = an_input(source, region, edits)
    return f"{name}.dtype" if name is not None else None


def an_input(
    source: SourcePositions, region: Sequence[ast.stmt], edits: Sequence[TextEdit]
) -> str | None:
    """A tensor that enters the region, named as the code names it before the region: the
    first name (or ``self`` attribute) the region upcasts (``h.float()``) that no statement of
    the region assigns; else the input ``x`` of a module call the region upcasts
    (``self.fc(x).float()``: in a ``model.half()`` forward its input has the model's dtype);
    else ``None``."""
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
                return name
    for stmt in region:  # else the input of a module the region calls upcast: ``self.fc(x)``
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)
                and (called := dotted_name(node.func)) is not None and called.startswith("self.")
                and source.span(node)[1] in upcast_at and node.args[0].id not in assigned
            ):
                return node.args[0].id
    return None


def upcast_operand(
    source: SourcePositions,
    expr: ast.expr,
    inside: AbstractSet[str] = frozenset(),
    numbers: Mapping[str, bool] | None = None,
    torch_names: AbstractSet[str] = frozenset({"torch"}),
    fp32_modules: bool = False,
    matmul_results: bool = False,
) -> list[TextEdit]:
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
    With ``matmul_results`` (no autocast-disabled region around: autocast casts a matmul's
    inputs down whatever they are) an ``a @ b`` is a leaf too: ``(a @ b).float()``.
    """
    numbers = numbers or {}

    def leaves(e: ast.expr) -> list[TextEdit]:
        if _is_upcast(e) or _is_constant(e) or isinstance(e, ast.Starred):
            return []
        if is_number_expr(e, numbers):
            return []
        names = {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}
        if names and names <= inside and not any(isinstance(n, ast.Call) for n in ast.walk(e)):
            return []
        if isinstance(e, ast.BinOp) and not (matmul_results and isinstance(e.op, ast.MatMult)):
            return [*leaves(e.left), *leaves(e.right)]
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub | ast.UAdd):
            return leaves(e.operand)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            receiver, method = e.func.value, e.func.attr
            root = root_name(receiver)
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
        if isinstance(e, ATOMIC_OPERANDS):
            return [TextEdit(end, end, ".float()")]
        return [TextEdit(start, start, "("), TextEdit(end, end, ").float()")]

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
        # the trace counts tensors only: an einsum's equation is no operand
        return [arg for arg in args if not _is_string(arg)][:n]
    return [arg for arg in args if not _is_constant(arg)]


def _is_string(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and isinstance(expr.value, str)


def _aug_assign_edits(
    source: SourcePositions,
    stmt: ast.AugAssign,
    symbol: str,
    numbers: Mapping[str, bool],
    value_uncast: bool = False,
) -> list[TextEdit] | None:
    """``x @= w`` -> ``x = x.float() @ w.float()`` (an in-place op cannot hold FP32). The
    value is left as it is when it is not a low-precision tensor (``value_uncast``: the trace
    saw a Python number or an FP32 tensor there), nor a number by its source: ``h *= self.scale``
    -> ``h = h.float() * self.scale``, never ``self.scale.float()`` on a float."""
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
    if value_uncast:
        return [TextEdit(start, start + len(symbol) + 1, replacement)]
    if isinstance(value, ATOMIC_OPERANDS) or _is_constant(value):
        cast = upcast_operand(source, value, numbers=numbers)
        return [TextEdit(start, start + len(symbol) + 1, replacement), *cast]
    # ``x *= w + 1`` -> ``x = x.float() * (w.float() + 1)``: the value keeps its precedence.
    # Of two insertions at one offset, the later one in this list lands before the earlier
    # (``apply_text_edits``): the closing parenthesis comes before the leaves' edits and the
    # opening one after them, so both enclose whatever a leaf adds at the value's ends.
    value_start, value_end = source.span(value)
    return [
        TextEdit(start, start + len(symbol) + 1, replacement),
        TextEdit(value_end, value_end, ")"),
        *upcast_operand(source, value, numbers=numbers),
        TextEdit(value_start, value_start, "("),
    ]


def upcast_edits(
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
    fp32_modules: bool | None = None,
    matmul_results: bool = False,
) -> list[TextEdit] | None:
    """Edits appending ``.float()`` to the op's tensor operands, or ``None``; operands known
    not to be low-precision floats (``uncast_operands``, by position: FP32 already, a bool
    mask, an int index, as the trace recorded their dtypes) or computed in the region are
    left. ``fp32_modules`` (``upcast_operand``; by default as ``fallback``): whether a module
    call's input is cast rather than its result."""
    if fp32_modules is None:
        fp32_modules = fallback
    module_names, torch_names = import_bindings(tree)
    node = find_op_node(stmt, line, op_name, torch_names, fallback)
    if node is None:
        return None
    numbers = dict.fromkeys(python_numbers(tree, line), True)
    if isinstance(node, ast.AugAssign):
        operator = binary_operator(op_name)
        assert operator is not None
        # one traced tensor operand: the value is a Python number (``self.scale = d ** 0.5``)
        value_uncast = 1 in uncast_operands or n_tensor_operands == 1
        return _aug_assign_edits(source, node, operator[1], numbers, value_uncast)
    if isinstance(node, ast.BinOp):
        operands = [node.left, node.right]
    else:
        assert isinstance(node, ast.Call)
        func = node.func
        matched = last_name(func) == op_name.rsplit(".", 1)[-1]
        method = (
            matched
            and isinstance(func, ast.Attribute)
            and root_name(func.value) not in module_names | torch_names
        )
        operands = _call_operands(node, n_tensor_operands, method)
    return [
        edit
        for i, operand in enumerate(operands)
        if i not in uncast_operands and not _holds_any(operand, region_ops)
        for edit in upcast_operand(
            source, operand, inside, numbers, torch_names, fp32_modules=fp32_modules,
            matmul_results=matmul_results,
        )
    ]


def outermost_binops(stmt: ast.stmt) -> list[ast.BinOp]:
    """The binary operations of ``stmt`` not inside another one, outside lambdas."""
    found: list[ast.BinOp] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.BinOp):
                found.append(child)
            elif not isinstance(child, DEFERRED_SCOPES):
                visit(child)

    visit(stmt)
    return found


def _holds_any(expr: ast.expr, nodes: Sequence[ast.AST]) -> bool:
    """``expr`` is, or contains, the result of another op of the region (already FP32)."""
    inner = set(map(id, ast.walk(expr)))
    return any(id(node) in inner for node in nodes)
