"""The rewrites that fix a precision finding (NH6xx) at its cause, made on the concrete source
text of a line (same contract as ``nan_hunter.fixes.rewrites``, on a text: the whole new text,
or None when the rewrite cannot be made safely):

- ``fp32_accumulator``: ``p.cumsum(1)`` -> ``p.cumsum(1, dtype=torch.float32)`` (NH603);
- ``fp32_integers``: ``torch.arange(n, dtype=h.dtype)`` -> ``dtype=torch.float32``,
  ``pos.to(h.dtype)`` -> ``pos.to(torch.float32)``, ``pos.half()`` -> ``pos.float()`` (NH601);
- ``dropped_cast``: ``self.inv_freq.to(h.dtype)`` -> ``self.inv_freq``: an FP32 operand of the
  integers' product kept FP32 (NH601);
- ``stable_form``: ``1 - torch.cos(x)`` -> ``2 * torch.sin(x / 2) ** 2``,
  ``torch.exp(x) - 1`` -> ``torch.expm1(x)``, ``torch.log(1 + x)`` -> ``torch.log1p(x)``
  (NH602, NH609): the same value, computed without the cancellation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from nan_hunter.fixes.rewrites import binds_torch, replace_spans
from nan_hunter.fixes.source_file import SourcePositions, last_name

FP32 = "torch.float32"

ACCUMULATORS = frozenset({"sum", "nansum", "cumsum", "cumprod", "prod"})
"""Calls that take ``dtype=``: the accumulator and the result's dtype."""

FACTORIES = frozenset({
    "arange", "linspace", "full", "ones", "zeros", "tensor", "as_tensor", "empty",
    "ones_like", "zeros_like", "full_like", "range",
})
"""Calls that make a tensor with the ``dtype=`` they are given."""

CASTS = frozenset({"to", "type", "half", "bfloat16"})


def _parse(text: str) -> tuple[str, ast.Module, SourcePositions] | None:
    """The text, its tree and positions; None when it cannot be parsed or does not bind
    ``torch`` at its top level (every rewrite names ``torch.float32`` or a ``torch`` function)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    return (text, tree, SourcePositions(text)) if binds_torch(tree) else None


def _calls_on(tree: ast.Module, line: int, names: frozenset[str]) -> Iterator[ast.Call]:
    """Calls on ``line`` (their name's line: a call spanning lines is found by its name) whose
    callee's last name is in ``names``, in source order."""
    found = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and last_name(node.func) in names
        and _name_line(node.func) == line
    ]
    yield from sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _name_line(func: ast.expr) -> int:
    if isinstance(func, ast.Attribute):
        return func.end_lineno or func.lineno
    return func.lineno


def _with_dtype(call: ast.Call, source: SourcePositions) -> tuple[int, int, str] | None:
    """The span that makes ``call``'s ``dtype=`` FP32: the keyword's value replaced, or the
    keyword added before the closing parenthesis."""
    for keyword in call.keywords:
        if keyword.arg == "dtype":
            start, end = source.span(keyword.value)
            return start, end, FP32
        if keyword.arg is None:
            return None  # **kwargs may carry a dtype: not ours to guess
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    _, end = source.span(call)
    if source.text[end - 1 : end] != ")":
        return None
    last = [*call.args, *(k.value for k in call.keywords)]
    if not last:
        return end - 1, end - 1, f"dtype={FP32}"
    after = max(source.span(node)[1] for node in last)  # right after the last argument
    return after, after, f", dtype={FP32}"


def fp32_accumulator(text: str, line: int, op: str) -> str | None:
    """The ``op`` call (``sum``, ``cumsum``, ...) on ``line`` accumulating into FP32:
    ``dtype=torch.float32`` added, or its ``dtype=`` made FP32."""
    parsed = _parse(text)
    if parsed is None or op not in ACCUMULATORS:
        return None
    text, tree, source = parsed
    for call in _calls_on(tree, line, frozenset({op})):
        span = _with_dtype(call, source)
        if span is not None:
            return replace_spans(text, [span])
    return None


def fp32_integers(text: str, line: int, op: str) -> str | None:
    """The ``op`` call on ``line`` that puts integers into low precision making them FP32
    instead: a factory's ``dtype=`` (``torch.arange(n, dtype=x.dtype)``), a cast's target
    (``.to(x.dtype)``, ``.type(torch.half)``), ``.half()``/``.bfloat16()`` -> ``.float()``."""
    parsed = _parse(text)
    if parsed is None:
        return None
    text, tree, source = parsed
    if op in FACTORIES:
        for call in _calls_on(tree, line, frozenset({op})):
            if any(k.arg == "dtype" for k in call.keywords):
                span = _with_dtype(call, source)
                if span is not None:
                    return replace_spans(text, [span])
        return None
    if op not in CASTS:
        return None
    for call in _calls_on(tree, line, frozenset({op})):
        if not isinstance(call.func, ast.Attribute):
            continue
        if op in ("half", "bfloat16") and not call.args and not call.keywords:
            start, end = source.span(call)
            receiver = source.segment(call.func.value)
            return replace_spans(text, [(start, end, f"{receiver}.float()")])
        if op in ("to", "type") and len(call.args) == 1 and not call.keywords:
            start, end = source.span(call.args[0])
            return replace_spans(text, [(start, end, FP32)])
    return None


def dropped_cast(text: str, line: int, op: str) -> str | None:
    """The cast ``op`` on ``line`` to a low-precision dtype taken out, its receiver left:
    ``self.inv_freq.to(h.dtype)`` -> ``self.inv_freq`` (an FP32 value stays FP32)."""
    parsed = _parse(text)
    if parsed is None or op not in CASTS:
        return None
    text, tree, source = parsed
    for call in _calls_on(tree, line, frozenset({op})):
        if isinstance(call.func, ast.Attribute) and len(call.args) <= 1 and not call.keywords:
            start, end = source.span(call)
            return replace_spans(text, [(start, end, source.segment(call.func.value))])
    return None


def stable_form(text: str, line: int, op: str) -> tuple[str, str] | None:
    """The expression on ``line`` at ``op`` written in a form that does not cancel:
    ``1 - cos(x)`` (at the subtraction), ``exp(x) - 1`` (at the subtraction), ``log(1 + x)``
    and ``log(1 - x)`` (at the log). ``(new text, what was rewritten)``."""
    parsed = _parse(text)
    if parsed is None:
        return None
    text, tree, source = parsed
    for node in _exprs_on(tree, line, source):
        new, what = None, ""
        if op in ("sub", "rsub") and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            if _is_one(node.left) and (x := _unary_call(node.right, "cos")) is not None:
                new = f"2 * torch.sin({source.segment(x)} / 2) ** 2"
                what = "1 - cos(x) as 2 * sin(x / 2) ** 2"
            elif _is_one(node.right) and (x := _unary_call(node.left, "exp")) is not None:
                new = f"torch.expm1({source.segment(x)})"
                what = "exp(x) - 1 as expm1(x)"
        elif op == "log" and isinstance(x := _unary_call(node, "log"), ast.BinOp):
            if _is_one(x.left) and isinstance(x.op, (ast.Add, ast.Sub)):
                arg = source.segment(x.right)
                if isinstance(x.op, ast.Sub):
                    simple = isinstance(x.right, (ast.Name, ast.Attribute, ast.Call))
                    arg = f"-{arg}" if simple else f"-({arg})"
                new = f"torch.log1p({arg})"
                what = "log(1 - x) as log1p(-x)" if isinstance(x.op, ast.Sub) else (
                    "log(1 + x) as log1p(x)"
                )
            elif _is_one(x.right) and isinstance(x.op, ast.Add):
                new = f"torch.log1p({source.segment(x.left)})"
                what = "log(x + 1) as log1p(x)"
        if new is not None:
            start, end = source.span(node)
            replaced = replace_spans(text, [(start, end, new)])
            return (replaced, what) if replaced is not None else None
    return None


def _exprs_on(tree: ast.Module, line: int, source: SourcePositions) -> list[ast.expr]:
    """The expressions spanning ``line``, innermost (shortest) first."""
    found = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.expr) and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return sorted(found, key=lambda n: source.span(n)[1] - source.span(n)[0])


def _is_one(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 1


def _unary_call(node: ast.AST, name: str) -> ast.expr | None:
    """``x`` of ``torch.name(x)`` or ``x.name()``; None for anything else."""
    if not isinstance(node, ast.Call) or last_name(node.func) != name or node.keywords:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
        func.value.id == "torch"
    ):
        return node.args[0] if len(node.args) == 1 else None
    if isinstance(func, ast.Attribute) and not node.args:
        return func.value
    return None
