"""Apply another device's autocast policy on this device: the CUDA policy on a CPU.

``torch.autocast("cpu")`` follows CPU autocast's op lists, which differ from CUDA's (AMP_FACTS.md).
``PolicyOverride`` registers, for the duration of a ``with`` block, Python kernels on the
``AutocastCPU`` dispatch key of every aten op in the wanted policy (casting inputs as that
policy does), and fallthrough kernels for the ops that only CPU autocast handles. The kernels are
removed on exit and the native CPU policy is back.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from nan_hunter.core.nest import leaves, map_leaves
from nan_hunter.errors import OURS_AS_THEY_ARE, InternalError
from nan_hunter.precision.emulation import explicit_dtype
from nan_hunter.precision.policy import Cast, Policy


class AutocastPolicyError(RuntimeError):
    """An op the emulated policy refuses: banned under autocast (``binary_cross_entropy``)."""

    def __init__(self, op: str, message: str) -> None:
        super().__init__(message)
        self.op = op


BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. "
    "Many models use a sigmoid layer right before the binary cross entropy layer. In this case, "
    "combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits or "
    "torch.nn.BCEWithLogitsLoss. binary_cross_entropy_with_logits and BCEWithLogits are safe to "
    "autocast."
)

_DEVICE_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}


def _eligible(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


def _cast_to(dtype: torch.dtype) -> Callable[[Any], Any]:
    def cast(x: Any) -> Any:
        return x.to(dtype) if _eligible(x) and x.dtype != dtype else x

    return cast


class PolicyOverride:
    """Within ``with``, autocast on ``device`` follows ``policy`` with ``low`` as its dtype."""

    def __init__(self, policy: Policy, device: str, low: torch.dtype) -> None:
        self._policy = policy
        self._key_name = _DEVICE_KEYS[device]
        self._key = getattr(torch._C.DispatchKey, self._key_name)
        self._low = low
        self._lib: torch.library.Library | None = None

    def __enter__(self) -> PolicyOverride:
        lib = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
                for name, cast in self._policy.casts.items():
                    for overload in _functional_overloads(name):
                        lib.impl(
                            _qualified(name, overload),
                            self._kernel(overload, cast),
                            self._key_name,
                            with_keyset=True,
                        )
                for registration in _native_registrations(self._key_name):
                    name, _, overload = registration.partition(".")
                    if name not in self._policy.casts:
                        lib.impl(registration, torch.library.fallthrough_kernel, self._key_name)
        except BaseException:
            lib._destroy()
            raise
        self._lib = lib
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

    def _kernel(self, op: torch._ops.OpOverload, cast: Cast) -> Callable[..., Any]:
        exclude = torch._C.DispatchKeySet(self._key)
        low = self._low
        name = op._schema.name.removeprefix("aten::")

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if cast is Cast.BANNED:  # the model's call of a banned op: the model's error
                raise AutocastPolicyError(name, BANNED_MESSAGE)
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                try:  # the casts are ours (``InternalError``), the op the model's
                    if cast is Cast.LOWER:
                        fn = _cast_to(low)
                    elif cast is Cast.FP32 or (
                        cast is Cast.FP32_UNLESS_DTYPE and not explicit_dtype(op, args, kwargs)
                    ):
                        fn = _cast_to(torch.float32)
                    elif cast is Cast.PROMOTE:
                        fn = _cast_to(_widest(args, kwargs))
                    else:
                        fn = _identity
                    cast_args, cast_kwargs = map_leaves(fn, args), map_leaves(fn, kwargs)
                except OURS_AS_THEY_ARE:
                    raise
                except Exception as exc:
                    raise InternalError(exc) from exc
                return op(*cast_args, **cast_kwargs)

        return kernel


def _identity(x: Any) -> Any:
    return x


def _widest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype:
    dtypes = [x.dtype for x in leaves((args, kwargs)) if _eligible(x)]
    if torch.float32 in dtypes:
        return torch.float32
    return dtypes[0] if dtypes else torch.float32


def _qualified(name: str, overload: torch._ops.OpOverload) -> str:
    suffix = overload._overloadname
    return name if suffix == "default" else f"{name}.{suffix}"


def _functional_overloads(name: str) -> list[torch._ops.OpOverload]:
    """The op's overloads that autocast applies to: not ``out=`` or in-place variants."""
    packet = getattr(torch.ops.aten, name)
    result = []
    for overload_name in packet.overloads():
        overload = getattr(packet, overload_name)
        if overload._schema.is_mutable:
            continue
        result.append(overload)
    return result


def _native_registrations(key: str) -> list[str]:
    """``name.overload`` of every aten op with a native kernel on ``key``."""
    names = []
    for entry in torch._C._dispatch_get_registrations_for_dispatch_key(key):
        if entry.startswith("aten::"):
            names.append(entry.removeprefix("aten::"))
    return names
