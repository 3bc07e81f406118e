"""Attribution of an op call to the user's source: file, line, code text and user-level op name.

The user frame is the first stack frame outside torch and nan_hunter. When the op was called
directly from that frame, the bytecode instruction at the call site tells an operator (``a * b``)
from the method it dispatches to (``a.mul(b)``), so the report can name ``Tensor.__mul__``.
"""

from __future__ import annotations

import dis
import inspect
import linecache
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import CodeType, FrameType

import torch
import torch.nn.functional as _functional

from nan_hunter.core.location import SourceLocation
from nan_hunter.project.paths import is_installed

_TORCH_ROOT = str(Path(torch.__file__).resolve().parent) + "/"
_OWN_ROOT = str(Path(__file__).resolve().parents[1]) + "/"

# Operators as Python compiles them (3.11+: BINARY_OP with an argrepr; 3.10: one opcode each).
_BINARY_OPERATORS = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
    "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift",
}  # fmt: skip
_LEGACY_BINARY = {
    "BINARY_ADD": "add", "BINARY_SUBTRACT": "sub", "BINARY_MULTIPLY": "mul",
    "BINARY_TRUE_DIVIDE": "truediv", "BINARY_FLOOR_DIVIDE": "floordiv", "BINARY_MODULO": "mod",
    "BINARY_POWER": "pow", "BINARY_MATRIX_MULTIPLY": "matmul",
    "INPLACE_ADD": "iadd", "INPLACE_SUBTRACT": "isub", "INPLACE_MULTIPLY": "imul",
    "INPLACE_TRUE_DIVIDE": "itruediv", "INPLACE_MATRIX_MULTIPLY": "imatmul",
    "INPLACE_POWER": "ipow",
}  # fmt: skip
_UNARY = {"UNARY_NEGATIVE": "neg", "UNARY_POSITIVE": "pos", "UNARY_INVERT": "invert"}
_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


@lru_cache(maxsize=4096)
def frame_origin(filename: str) -> str:
    """``"torch"``, ``"own"`` (nan_hunter) or ``"user"`` for the file a frame runs."""
    if filename.startswith("<frozen"):
        return "torch"
    try:
        resolved = str(Path(filename).resolve())
    except OSError:
        return "user"
    if resolved.startswith(_TORCH_ROOT):
        return "torch"
    if resolved.startswith(_OWN_ROOT):
        return "own"
    return "user"


def user_frame(start: FrameType) -> tuple[FrameType | None, bool]:
    """The frame to blame for an op called at ``start``, and whether it is the user's own code.

    Walks outwards past torch's frames to the first frame outside torch and nan_hunter. Reaching
    nan_hunter's own frames first means the op ran in torch code that nan-hunter called directly
    (a bare ``nn.Linear`` as the model): then the innermost torch frame is returned instead.
    """
    frame: FrameType | None = start
    innermost_torch: FrameType | None = None
    while frame is not None:
        origin = frame_origin(frame.f_code.co_filename)
        if origin == "user":
            return frame, True
        if origin == "own":
            return innermost_torch, False
        if innermost_torch is None and not frame.f_code.co_filename.endswith("overrides.py"):
            innermost_torch = frame
        frame = frame.f_back
    return innermost_torch, False


def project_frame(frame: FrameType) -> FrameType | None:
    """The nearest frame outward from ``frame`` (an installed library's) that runs the user's
    own project code: not torch, not nan_hunter, not an installed package."""
    outer = frame.f_back
    while outer is not None:
        filename = outer.f_code.co_filename
        if frame_origin(filename) == "own":
            return None
        if frame_origin(filename) == "user" and not is_installed(filename):
            return outer
        outer = outer.f_back
    return None


def location_of(frame: FrameType) -> SourceLocation:
    filename = frame.f_code.co_filename
    line = frame.f_lineno or 0
    code = linecache.getline(filename, line).strip()
    return SourceLocation(file=filename, line=line, code=code)


@lru_cache(maxsize=16384)
def _instruction_at(code: CodeType, offset: int) -> tuple[str, str]:
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset:
            return instruction.opname, instruction.argrepr
    return "", ""


def operator_name(frame: FrameType) -> str | None:
    """``__mul__``-style dunder name when ``frame`` is executing a Python operator, else None."""
    opname, argrepr = _instruction_at(frame.f_code, frame.f_lasti)
    if opname == "BINARY_OP":
        inplace = argrepr.endswith("=")
        base = _BINARY_OPERATORS.get(argrepr.rstrip("="))
        if base is None:
            return None
        return f"__i{base}__" if inplace else f"__{base}__"
    if opname == "BINARY_SUBSCR":
        return "__getitem__"
    if opname == "STORE_SUBSCR":
        return "__setitem__"
    if opname == "COMPARE_OP":
        base = _COMPARE.get(argrepr)
        return f"__{base}__" if base else None
    for table in (_LEGACY_BINARY, _UNARY):
        if opname in table:
            return f"__{table[opname]}__"
    return None


def op_display_name(func: Callable[..., object]) -> str:
    """User-level name of a torch function: ``torch.matmul``, ``Tensor.softmax``,
    ``torch.nn.functional.linear``."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":  # a property such as Tensor.T
        return f"Tensor.{getattr(getattr(func, '__self__', None), '__name__', name)}"
    qualname = getattr(func, "__qualname__", None) or name
    module = getattr(func, "__module__", None) or ""
    objclass = getattr(func, "__objclass__", None)
    if objclass is not None and objclass.__name__ in ("TensorBase", "_TensorBase", "Tensor"):
        return f"Tensor.{name}"
    if qualname.startswith(("Tensor.", "TensorBase.", "_TensorBase.")):
        return "Tensor." + qualname.split(".", 1)[1]
    if qualname.startswith("_VariableFunctionsClass.") or module in ("torch", "torch.functional"):
        return f"torch.{name}"
    if module.startswith("torch._C._nn") or qualname.startswith("_nn."):
        public = hasattr(_functional, name)
        return f"torch.nn.functional.{name}" if public else f"torch._C._nn.{name}"
    if module.startswith("torch._C._linalg"):
        return f"torch.linalg.{name.removeprefix('linalg_')}"
    if module.startswith("torch._C._special"):
        return f"torch.special.{name.removeprefix('special_')}"
    if module.startswith("torch._C._fft"):
        return f"torch.fft.{name.removeprefix('fft_')}"
    if module:
        return f"{module}.{qualname}"
    return f"torch.{name}"


def call_site_name(func: Callable[..., object], direct_caller: FrameType | None) -> str:
    """The op name as the user wrote it: an operator's dunder when the call site is an operator."""
    name = op_display_name(func)
    if direct_caller is not None and name.startswith("Tensor.") and not name.endswith("__"):
        dunder = operator_name(direct_caller)
        if dunder is not None and name != f"Tensor.{dunder}":
            return f"Tensor.{dunder}"
    return name


class SiteResolver:
    """``(op name, location, in user code)`` of a call, resolved once per call site.

    The user frame is found by walking outwards with each code object's origin looked up once;
    the op name and the source line are then a function of (function, code, instruction
    offset), cached: a model that runs the same line a thousand times reads it once.
    """

    def __init__(self) -> None:
        self._origins: dict[CodeType, str] = {}
        self._sites: dict[tuple[object, ...], tuple[str, SourceLocation | None, bool]] = {}
        self._installed_code: dict[CodeType, bool] = {}

    def _origin(self, code: CodeType) -> str:
        origin = self._origins.get(code)
        if origin is None:
            origin = frame_origin(code.co_filename)
            self._origins[code] = origin
        return origin

    def _user_frame(self, start: FrameType) -> tuple[FrameType | None, bool]:
        # user_frame(), with the origin looked up per code object.
        frame: FrameType | None = start
        innermost_torch: FrameType | None = None
        while frame is not None:
            code = frame.f_code
            origin = self._origin(code)
            if origin == "user":
                return frame, True
            if origin == "own":
                return innermost_torch, False
            if innermost_torch is None and not code.co_filename.endswith("overrides.py"):
                innermost_torch = frame
            frame = frame.f_back
        return innermost_torch, False

    def site(
        self, start: FrameType, func: Callable[..., object]
    ) -> tuple[str, SourceLocation | None, bool, SourceLocation | None]:
        """(op name, location, in user code, call site): the call site is the nearest frame in
        the user's project when the location is in an installed library (found per call: it
        depends on the whole stack, not on the line alone)."""
        frame, in_user_code = self._user_frame(start)
        key = (func, frame.f_code, frame.f_lasti, in_user_code) if frame else (func,)
        try:
            found = self._sites.get(key)
        except TypeError:  # an unhashable callable
            found = self._resolve(func, frame, in_user_code)
        else:
            if found is None:
                found = self._resolve(func, frame, in_user_code)
                self._sites[key] = found
        call_site = None
        if frame is not None and in_user_code and self._installed(frame.f_code):
            outer = project_frame(frame)
            call_site = location_of(outer) if outer is not None else None
        return (*found, call_site)

    def _installed(self, code: CodeType) -> bool:
        installed = self._installed_code.get(code)
        if installed is None:
            installed = is_installed(code.co_filename)
            self._installed_code[code] = installed
        return installed

    @staticmethod
    def _resolve(
        func: Callable[..., object], frame: FrameType | None, in_user_code: bool
    ) -> tuple[str, SourceLocation | None, bool]:
        location = location_of(frame) if frame is not None else None
        return call_site_name(func, frame if in_user_code else None), location, in_user_code


def backward_location(function: type) -> SourceLocation | None:
    """The ``def backward`` line of a custom ``autograd.Function`` (its decorators skipped)."""
    backward = getattr(function, "backward", None)
    if callable(backward):
        backward = inspect.unwrap(backward)  # under once_differentiable and other wrappers
    code = getattr(backward, "__code__", None)
    if code is None:
        return None
    file, line = code.co_filename, code.co_firstlineno
    for offset in range(16):  # @staticmethod and any other decorators stand above the def
        text = linecache.getline(file, line + offset).strip()
        if text.startswith(("def ", "async def ")):
            return SourceLocation(file=file, line=line + offset, code=text)
    return SourceLocation(file=file, line=line, code=linecache.getline(file, line).strip())
