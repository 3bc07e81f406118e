"""A submodule of an installed library kept in FP32 from the user's own file.

When the culprit op runs inside an installed package (a transformers layer), the library's
code is not the user's to edit, and an FP32 region at the call site keeps the whole library
call in FP32. The user can still keep one submodule in FP32 from where the model is built:
``build_model()`` returns the model through a helper that registers a forward pre-hook and a
forward hook on ``model.get_submodule(name)``::

    def build_model():
        model = AutoModel.from_config(config)
        return _run_in_fp32(model, "encoder.layer.3.attention.self")

The pre-hook disables autocast and casts the floating inputs to float32; the hook restores
autocast (also when the forward raises) and casts the outputs back to the dtype of the first
floating input where they fit that dtype. Hooks, not a replaced ``forward``: they receive the
module, so a copy of the model (``copy.deepcopy``) keeps working on its own parameters.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch

from nan_hunter.findings import Edit
from nan_hunter.fixes.autocast_region import insert_line, newline_of
from nan_hunter.fixes.edits import edits_between
from nan_hunter.fixes.source_file import (
    SourceError,
    SourcePositions,
    compiles,
    read_source,
    split_lines,
)
from nan_hunter.fixes.statements import has_torch_import, import_insert_index
from nan_hunter.project.paths import is_installed

HELPER = "_run_in_fp32"

_HELPER_TEXT = '''\
def {name}(model, name):
    """Run ``model.get_submodule(name)`` in FP32 under autocast (nan-hunter: an op inside it
    overflows {fmt}): autocast disabled and floating inputs cast to float32 for it alone,
    its outputs cast back to its first floating input's dtype where they fit."""
    regions = []

    def up(value):
        return value.float() if torch.is_tensor(value) and value.is_floating_point() else value

    def down(value, dtype):
        if not torch.is_tensor(value) or dtype is None or value.dtype in (dtype, torch.float64):
            return value
        if not value.is_floating_point():
            return value
        cast = value.to(dtype)
        return cast if bool(torch.isfinite(cast).all()) else value

    def before(module, args, kwargs):
        found = [v for v in (*args, *kwargs.values()) if torch.is_tensor(v)]
        dtype = next((v.dtype for v in found if v.is_floating_point()), None)
        region = torch.autocast(device_type="{device}", enabled=False)
        region.__enter__()
        regions.append((region, dtype))
        return tuple(up(a) for a in args), {{k: up(v) for k, v in kwargs.items()}}

    def after(module, args, kwargs, output):
        region, dtype = regions.pop()
        region.__exit__(None, None, None)
        if type(output) is tuple:
            return tuple(down(o, dtype) for o in output)
        return down(output, dtype)

    module = model.get_submodule(name)
    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True, always_call=True)
    return model
'''


@dataclass(frozen=True)
class ModelSite:
    """Where the user's file builds the model: the entry file and the function returning it."""

    file: Path
    function: str = "build_model"


@dataclass(frozen=True)
class LibraryScope:
    """The modules around a culprit inside an installed library that the user can keep in
    FP32 from ``site``, narrowest first."""

    site: ModelSite
    modules: tuple[tuple[str, str], ...]
    """``(path, class name)`` of the culprit's module and of each ancestor that an installed
    package defines and that is called (not a ``ModuleList``), up to the outermost; never the
    model's root (all of it in FP32 is no fix)."""
    call: str
    """The outermost of them, or ``""`` when the root itself is the library's model: what an
    FP32 region around the call in the user's code keeps in FP32."""


_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList,
               torch.nn.ParameterDict)


def library_scope(model: torch.nn.Module, module: str, site: ModelSite) -> LibraryScope | None:
    """The scope of a culprit that ran in ``module`` (a path from ``model``) inside an
    installed library; None when no module of an installed package holds it."""
    parts = module.split(".") if module else []
    found: list[tuple[str, str]] = []
    call = None
    for depth in range(len(parts), -1, -1):
        path = ".".join(parts[:depth])
        try:
            sub = model.get_submodule(path)
        except AttributeError:
            return None
        if not _installed_class(type(sub)):
            break  # the user's own module: the library was called from here
        call = path
        if path and not isinstance(sub, _CONTAINERS):
            found.append((path, type(sub).__name__))
    if call is None or not found:
        return None
    return LibraryScope(site, tuple(found), call)


def _installed_class(cls: type) -> bool:
    try:
        file = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return False
    return file is not None and is_installed(file)


def build_kept_submodule_edits(
    site: ModelSite, module: str, *, device_type: str, fmt: str
) -> tuple[Edit, ...] | None:
    """The edits keeping ``module`` (a path from the model's root, never the root) in FP32:
    the helper defined above ``site.function`` (once: an existing one is reused) and every
    ``return`` of that function wrapped in it. None when the function is not a top-level
    ``def`` of the file, returns nothing, or the result does not compile."""
    if not module:
        return None
    path = site.file.resolve()
    try:
        source = read_source(path)
        tree = ast.parse(source.text)
    except (SourceError, SyntaxError, ValueError):
        return None
    function = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == site.function),
        None,
    )
    if function is None:
        return None
    returns = [r for r in _own_returns(function) if r.value is not None]
    if not returns:
        return None
    positions = SourcePositions(source.text)
    text = source.text
    for node in sorted(returns, key=lambda r: (r.lineno, r.col_offset), reverse=True):
        value = node.value
        assert value is not None and value.end_lineno is not None
        assert value.end_col_offset is not None
        start = positions.offset(value.lineno, value.col_offset)
        end = positions.offset(value.end_lineno, value.end_col_offset)
        text = f'{text[:start]}{HELPER}({text[start:end]}, "{module}"){text[end:]}'
    lines = split_lines(text)
    newline = newline_of(lines)
    has_helper = any(
        isinstance(n, ast.FunctionDef) and n.name == HELPER for n in tree.body
    )
    first = min(
        [function.lineno, *(d.lineno for d in function.decorator_list)]
    )
    if not has_helper:
        helper = _HELPER_TEXT.format(name=HELPER, device=device_type, fmt=fmt)
        block = [line + newline for line in helper.splitlines()] + [newline, newline]
        lines[first - 1:first - 1] = block
    if not has_torch_import(tree.body, first, False):
        insert_line(lines, import_insert_index(tree.body, positions, first, False),
                    f"import torch{newline}", newline)
    new_text = "".join(lines)
    if not compiles(new_text, str(path)):
        return None
    return edits_between(path, source.text, new_text)


def _own_returns(function: ast.FunctionDef) -> list[ast.Return]:
    """The ``return`` statements of ``function`` itself, not of functions or classes in it."""
    found: list[ast.Return] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found
