"""Fast FP16 numerics on a CPU: compute in FP32 on FP16 values, round results to FP16.

Real CUDA FP16 GEMMs accumulate in FP32 and round their output once, and elementwise FP16 kernels
compute in FP32 ("opmath") and round; so "FP32 on FP16-rounded inputs, output rounded to FP16"
reproduces them up to last-ulp differences, while CPU FP16 kernels without FP16 units are about
100x slower than FP32. ``LowPrecisionEmulation`` is a ``TorchDispatchMode`` (below autograd and
autocast, so both keep their semantics and every tensor keeps its logical dtype): for each aten op
whose floating inputs are all FP16 it upcasts them, runs the op in FP32 and rounds the floating
outputs back to FP16, in forward and backward alike.

Left to the real kernels: ops that mutate or alias their inputs (in-place, views), random ops
(their streams depend on the dtype), ops with an explicit ``dtype=``, and data movement.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from itertools import chain
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.utils._python_dispatch import TorchDispatchMode

from nan_hunter.core.nest import call_leaves, map_leaves
from nan_hunter.errors import OURS_AS_THEY_ARE, InternalError
from nan_hunter.precision import heap
from nan_hunter.precision.grad_nodes import current_node
from nan_hunter.precision.gradients import GradientLog

aten = torch.ops.aten

# Data movement and constructors: exact in FP16 already, no arithmetic to emulate. (Not
# ``embedding_dense_backward``: it sums the gradient rows of repeated ids, in FP32 on CUDA.)
_NATIVE = frozenset(
    {
        aten._to_copy.default, aten.clone.default, aten.copy_.default, aten.cat.default,
        aten.stack.default, aten.index.Tensor, aten.index_select.default, aten.gather.default,
        aten.embedding.default, aten.where.self, aten.masked_fill.Scalar,
        aten.masked_fill.Tensor, aten.zeros_like.default, aten.ones_like.default,
        aten.empty_like.default, aten.full_like.default, aten.constant_pad_nd.default,
        aten.slice_backward.default, aten.select_backward.default, aten.lift_fresh.default,
        aten._local_scalar_dense.default, aten.repeat.default,
    }
)  # fmt: skip

_RELABELLING = (
    "_unsafe_view", "_reshape_copy", "view_copy", "alias_copy", "t_copy", "transpose_copy",
    "permute_copy", "expand_copy", "squeeze_copy", "unsqueeze_copy", "select_copy",
    "slice_copy", "narrow_copy", "diagonal_copy", "as_strided_copy", "unfold_copy",
    "detach_copy", "split_copy", "split_with_sizes_copy", "unbind_copy", "flip", "roll",
    "rot90", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "take", "masked_select",
)  # fmt: skip
"""Ops that return the input's values rearranged, with no alias annotation (so ``_emulable``
would take them): upcasting to FP32 and rounding back would copy a tensor twice for nothing.
``reshape`` of a non-contiguous tensor and ``matmul``'s flattening reach ``_unsafe_view``."""


def _overloads(names: tuple[str, ...]) -> frozenset[torch._ops.OpOverload]:
    """Every overload of the named aten ops this torch has."""
    found = []
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            found += [getattr(packet, overload) for overload in packet.overloads()]
    return frozenset(found)


_NATIVE = _NATIVE | _overloads(_RELABELLING)

_ALLOCATING = _overloads(
    ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")
)
"""Ops that return memory no op wrote (a backward's ``new_empty_strided`` before its
``copy_``): nothing to emulate, and what they hold is no gradient the log may measure (an
``empty_like(grad, dtype=torch.float16)`` is no gradient cast down). Emulated, the garbage
rounded to FP16 was logged as a gradient: a largest gradient of 1e19 backed GradScaler off."""
_NATIVE = _NATIVE | _ALLOCATING


class LowPrecisionEmulation(TorchDispatchMode):
    """Emulate ``low``-dtype (FP16) arithmetic with FP32 kernels and rounding."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Not wrapped in torch._dynamo.disable: that wrapper imports dynamo (~3 s) on first use,
        # and nan-hunter scans eager modules only.
        return False

    def __init__(
        self, low: torch.dtype = torch.float16, gradients: GradientLog | None = None
    ) -> None:
        super().__init__()
        self.low = low
        self.gradients = gradients
        """Where to log what rounding does to gradients (during a backward), if anywhere."""
        self.emulated = 0
        """How many op calls were emulated (for tests and benchmarks)."""
        self._decisions: dict[torch._ops.OpOverload, bool | int] = {}
        """Per op: emulated or not, or the position of its ``dropout_p`` (emulated at 0)."""
        self.heap = heap.HeapTrimmer(heap.backward_trim_bytes())
        """Trims the heap as the backward's FP32 temporaries add up (``precision.heap``)."""
        self._upcasts = _NodeUpcasts()

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        # Our work around the op (choosing, upcasting, rounding, logging) is ours: its failure
        # is an ``InternalError``; the op's own is passed on as it is. Inline ``try``s: free
        # when nothing raises, and no call per op.
        try:
            in_backward = torch._C._current_graph_task_id() != -1
            log = self.gradients if in_backward else None
            flat = _flat(args) and (not kwargs or _flat(kwargs.values()))
            values = (chain(args, kwargs.values()) if kwargs else args) if flat else (
                call_leaves(args, kwargs)
            )
            fp32_stats = _FP32_STATS_INPUTS.get(func)
            if fp32_stats is not None and fp32_stats < len(args):  # read in FP32, as the kernel's
                values = chain(args[:fp32_stats], args[fp32_stats + 1 :], kwargs.values())
            emulated = self._eligible_op(func, args, kwargs) and _all_low(values, self.low)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc
        if not emulated:
            out = func(*args, **kwargs)
            try:
                if log is not None and args and func not in _ALLOCATING and (
                    _same_shape_tensors(args[0], out)
                ):
                    if args[0].dtype == torch.float32 and out.dtype == self.low:
                        log.record(args[0], out, boundary=True)  # an FP32 gradient cast down
                    else:
                        log.inherit(args[0], out)  # a transpose or the cast back to FP32
            except OURS_AS_THEY_ARE:
                raise
            except Exception as exc:
                raise InternalError(exc) from exc
            return out
        try:
            low = self.low
            upcasts = self._upcasts
            if in_backward:
                # Only the node's own formula (called by the engine, not from Python) shares
                # copies: a hook or a saved-tensor hook runs as the same node, and may write a
                # tensor through ``.data`` (no new version) between two reads.
                upcasts.enter(current_node(), sys._getframe(1).f_code is _ENGINE_CODE)

            def up(x: Any) -> Any:
                if not isinstance(x, torch.Tensor) or x.dtype != low:
                    return x
                return upcasts.up(x) if in_backward else x.float()

            up_args: tuple[Any, ...] | None = None
            if flat:  # most calls: no nesting, no dtype argument
                up_args = tuple([up(x) for x in args])
                up_kwargs = {key: up(x) for key, x in kwargs.items()} if kwargs else kwargs
            else:
                # A dtype argument (``sum(dtype=...)``, ``_softmax_backward_data(input_dtype=
                # ...)``): emulated only when it names the low dtype, computing in FP32 instead.
                new_args, new_kwargs, ok = _retarget_dtypes(args, kwargs, low)
                if ok:
                    args, kwargs = new_args, new_kwargs
                    up_args, up_kwargs = map_leaves(up, args), map_leaves(up, kwargs)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc
        if up_args is None:  # another dtype named: the real kernel
            return func(*args, **kwargs)
        self.emulated += 1
        out = func(*up_args, **up_kwargs)
        try:
            if in_backward:  # the new upcast copies and the FP32 result go by the node's end
                self.heap.freed(upcasts.take_copied() + _fp32_bytes(out))
            keep = _fp32_outputs(func, args)

            def down(x: Any) -> Any:
                rounded = _down(x, low)
                if log is not None and rounded is not x:
                    log.record(x, rounded)
                return rounded

            if isinstance(out, torch.Tensor):
                return out if 0 in keep else down(out)
            if isinstance(out, (tuple, list)):
                return type(out)(x if i in keep else down(x) for i, x in enumerate(out))
            return map_leaves(down, out)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc

    def __exit__(self, *exc: object) -> None:
        self._upcasts.clear()
        super().__exit__(*exc)

    def _eligible_op(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        decision = self._decisions.get(func)
        if decision is None:
            decision = _emulable(func)
            self._decisions[func] = decision
        if decision is True or decision is False:
            return decision
        return _without_dropout(func, decision, args, kwargs)


class _NodeUpcasts:
    """The FP32 copies of the FP16 tensors one autograd node's backward reads: an addmm's
    incoming gradient feeds the input's mm, the weight's mm (transposed) and the bias's sum, and
    is upcast once, its other views taken from the copy. The copies go when the next node runs.

    A tensor is copied whole only when it covers its storage exactly (offset 0, every element
    once); its views then index the copy as they index the storage. The FP16 tensor is held
    with its copy, so that its storage (the key) cannot be freed and reused meanwhile; a write
    to it changes its version, which is part of the key.
    """

    __slots__ = ("_copied", "_copies", "_node", "_shared")

    def __init__(self) -> None:
        self._node: object = None
        self._shared = False
        self._copies: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._copied = 0

    def enter(self, node: object, engine: bool = True) -> None:
        """``engine``: the op is called by the autograd engine (the node's C++ formula), not by
        Python code running as the node (its hooks, a custom Function's backward)."""
        if node is not self._node or node is None:
            self._copies = {}
            # A custom Function's backward is the user's Python, which may write a tensor
            # through ``.data`` (no new version): no copies are kept there.
            self._node = None if isinstance(node, BackwardCFunction) else node
        self._shared = engine and self._node is not None

    def up(self, x: torch.Tensor) -> torch.Tensor:
        if not self._shared or x.is_inference():  # an inference tensor has no version
            copy = x.float()
            self._copied += copy.numel() * 4
            return copy
        storage = x.untyped_storage()
        key = (storage.data_ptr(), x._version)
        held = self._copies.get(key)
        if held is not None:
            return held[1].as_strided(x.shape, x.stride(), x.storage_offset())
        copy = x.float()
        self._copied += copy.numel() * 4
        whole = x.storage_offset() == 0 and x.numel() * x.element_size() == storage.nbytes()
        if whole and copy.stride() == x.stride():
            self._copies[key] = (x, copy)
        return copy

    def take_copied(self) -> int:
        """Bytes of the copies made since the last call (what paces the heap trims)."""
        copied, self._copied = self._copied, 0
        return copied

    def clear(self) -> None:
        self._node, self._copies, self._copied, self._shared = None, {}, 0, False


_ENGINE_CODE = getattr(
    getattr(torch.autograd.graph, "_engine_run_backward", None), "__code__", None
)
"""The Python frame below a node's C++ formula (its ops' caller); None: no copy is shared."""


_NESTED_OR_DTYPE = (tuple, list, dict, torch.dtype)


def _flat(values: Any) -> bool:
    """Whether no value is a container or a dtype (the call needs no ``_retarget_dtypes`` and
    no nested mapping; aten takes dtypes as top-level arguments only)."""
    for x in values:  # noqa: SIM110 (a plain loop: no generator per op call)
        if isinstance(x, _NESTED_OR_DTYPE):
            return False
    return True


def _all_low(values: Iterable[Any], low: torch.dtype) -> bool:
    """Whether the call's values hold a floating tensor, all of them in ``low``."""
    seen = False
    for x in values:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if x.dtype != low:
                return False
            seen = True
    return seen


def _fp32_bytes(values: Any) -> int:
    """Bytes of the FP32 tensors in ``values``: a tensor, or a flat tuple or list of values
    (nested ones are not counted: the count only paces the heap trims)."""
    if isinstance(values, torch.Tensor):
        return values.numel() * 4 if values.dtype == torch.float32 else 0
    if not isinstance(values, (tuple, list)):
        return 0
    return sum(
        x.numel() * 4 for x in values if isinstance(x, torch.Tensor) and x.dtype == torch.float32
    )


def _same_shape_tensors(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() == b.numel()


def _down(x: Any, low: torch.dtype) -> Any:
    return x.to(low) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


def _fp32_outputs(func: torch._ops.OpOverload, args: tuple[Any, ...]) -> frozenset[int]:
    """Outputs that the real kernels return in FP32 even for FP16 inputs."""
    if func in (aten._softmax.default, aten._log_softmax.default):
        return frozenset({0}) if len(args) > 2 and args[2] else frozenset()
    return _STATS_IN_FP32.get(func, frozenset())


_STATS_IN_FP32: dict[Any, frozenset[int]] = {}
if hasattr(aten, "_fused_rms_norm"):
    _STATS_IN_FP32[aten._fused_rms_norm.default] = frozenset({1})
_FP32_STATS_INPUTS: dict[Any, int] = {}
"""Ops whose argument at this position is such an FP32 output, read back in FP32 (the other
floating inputs low): emulated all the same."""
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
    # The CPU flash attention (``F.scaled_dot_product_attention``'s kernel on a CPU) returns
    # its logsumexp in FP32 for FP16 inputs, as CUDA's does, and its backward reads it back.
    # Left to the real kernels, an FP16 attention's backward took 10x the FP32 one (a 210M
    # Llama: 0.82 of its scan's 5.1 s).
    _STATS_IN_FP32[aten._scaled_dot_product_flash_attention_for_cpu.default] = frozenset({1})
    _FP32_STATS_INPUTS[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = 5


def _without_dropout(
    func: torch._ops.OpOverload, at: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether a call of an op with a ``dropout_p`` (at position ``at``) asks for none: it then
    draws no random numbers, and is emulated."""
    if at < len(args):
        p = args[at]
    else:
        p = kwargs.get("dropout_p", func._schema.arguments[at].default_value)
    return isinstance(p, (int, float)) and p == 0


def explicit_dtype(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> (
    bool
):
    """Whether the call passes a ``dtype=`` (by keyword or position) that is not None."""
    if kwargs.get("dtype") is not None:
        return True
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "dtype":
            return i < len(args) and args[i] is not None
    return False


def _retarget_dtypes(
    args: tuple[Any, ...], kwargs: dict[str, Any], low: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
    """Args with every dtype equal to ``low`` replaced by float32; ok=False if another dtype
    is named (the op was asked for a specific output dtype: leave it to the real kernel)."""
    ok = True

    def retarget(x: Any) -> Any:
        nonlocal ok
        if isinstance(x, torch.dtype) and x.is_floating_point:
            if x != low:
                ok = False
            return torch.float32
        return x

    new_args, new_kwargs = map_leaves(retarget, (args, kwargs))
    return new_args, new_kwargs, ok


# Linear algebra has no FP16 kernels on CUDA ("Low precision dtypes not supported"): leave it to
# the real kernel, which fails the same way on the CPU, instead of quietly computing it in FP32.
_NO_LOW_PRECISION = frozenset(
    {
        "inverse", "cholesky", "cholesky_inverse", "cholesky_solve", "svd", "qr", "geqrf",
        "triangular_solve", "orgqr", "ormqr", "pinverse", "lu_solve", "_lu_with_info",
        "lu_unpack", "det", "logdet", "slogdet", "matrix_exp",
    }
)  # fmt: skip
_LOW_PRECISION_LINALG = frozenset({"linalg_vecdot", "linalg_vector_norm", "linalg_matrix_norm"})


def _lacks_low_precision(name: str) -> bool:
    base = name.removeprefix("aten::").split(".")[0]
    if base in _LOW_PRECISION_LINALG:
        return False
    return base in _NO_LOW_PRECISION or base.startswith(("linalg_", "_linalg_"))


def _emulable(func: torch._ops.OpOverload) -> bool | int:
    """Whether ``func`` is emulated; for an op whose only randomness is a ``dropout_p``
    (attention), the position of that argument: emulated when it is 0."""
    if func in _NATIVE or _lacks_low_precision(func._schema.name):
        return False
    schema = func._schema
    if schema.is_mutable:
        return False
    if any(r.alias_info is not None for r in schema.returns):
        return False
    if not any(str(r.type) in ("Tensor", "Tensor[]", "Tensor?") for r in schema.returns):
        return False
    dropout = next((i for i, a in enumerate(schema.arguments) if a.name == "dropout_p"), None)
    if torch.Tag.nondeterministic_seeded in func.tags or dropout is not None:
        return dropout if dropout is not None else False
    return True
