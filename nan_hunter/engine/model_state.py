"""A model's state across a scan: the snapshot and exact restore of its parameters, buffers,
``.grad``, ``requires_grad`` and train/eval flags, and the dtype casts of a pass that the
restore undoes (``model.half()`` for half mode, FP32 for the reference of a model already in
FP16)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from nan_hunter.engine.blame import user_errors
from nan_hunter.errors import InternalError, NanHunterError, UserCodeError


class ModelState:
    """A snapshot of everything a forward/backward can change in a model, and its restore.

    Buffers (BatchNorm statistics, which kernels update in place) are copied up front.
    Parameters are copied lazily: the tracer calls ``protect`` before any in-place op on a
    tensor that shares a parameter's storage (``p.add_``, ``p.data.clamp_``), so a scan costs
    no second copy of the weights. On restore, what was written to (version counter moved, or
    protected) or swapped for a half-precision copy is put back.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        with torch.no_grad():
            self._buffers = [(b, b.data, b._version, b.detach().clone()) for b in model.buffers()]
        self._params = [(p, p.data, p._version) for p in model.parameters()]
        self._data_versions = [data._version for _, data, _ in self._params]
        # Which tensor each module holds under each name: forward may rebind a buffer
        # (``self.running = 0.9 * self.running + ...``); the original object is put back.
        self._slots = [
            (slots, name, tensor)
            for m in model.modules()
            for slots in (m._buffers, m._parameters)
            for name, tensor in slots.items()
        ]
        self._storages = {_storage(p): p for p in model.parameters()}
        self._saved: dict[int, torch.Tensor] = {}
        # ``model.half()`` (``_apply``) converts each ``.grad`` in place too (``grad.data``):
        # its FP32 data is kept, or ``p.grad = grad`` would refuse the half one on restore.
        self._grads = [
            (p, p.grad, None if p.grad is None else p.grad.data) for p in model.parameters()
        ]
        self._requires_grad = [(p, p.requires_grad) for p in model.parameters()]
        self._training = [(m, m.training) for m in model.modules()]

    def protect(self, tensor: torch.Tensor) -> None:
        """Copy the parameter whose storage ``tensor`` shares, before it is written to."""
        key = _storage(tensor)
        param = self._storages.get(key)
        if param is not None and key not in self._saved:
            with torch.no_grad():
                self._saved[key] = param.detach().clone()

    def restore(self) -> None:
        """Put everything back; each part is restored even when another fails (the first
        failure is raised after all of them ran)."""
        failures: list[Exception] = []
        unrestorable: list[torch.Tensor] = []
        for step in (
            self._restore_slots,
            self._restore_buffers,
            lambda: unrestorable.extend(self._restore_params()),
            self._restore_grads,
            self._restore_requires_grad,
            self._restore_training,
        ):
            try:
                step()
            except Exception as exc:  # the other parts are restored all the same
                failures.append(exc)
        if failures:
            first = failures[0]
            if isinstance(first, NanHunterError):  # the model's train() override raised
                raise first
            raise InternalError(first) from first
        if unrestorable:
            names = {id(p): n for n, p in self._model.named_parameters()}
            raise UserCodeError(
                "the model wrote to its parameters in place, out of nan-hunter's sight "
                f"({', '.join(names.get(id(p), '?') for p in unrestorable)}); they cannot be "
                "restored"
            )

    def _restore_slots(self) -> None:
        for slots, name, tensor in self._slots:
            if slots.get(name) is not tensor:
                slots[name] = tensor

    def _restore_buffers(self) -> None:
        with torch.no_grad():
            for live, data, version, saved in self._buffers:
                if live.data is not data:  # converted for a half-precision pass
                    live.data = data
                if live._version != version or data._version != version:
                    data.copy_(saved)

    def _restore_params(self) -> list[torch.Tensor]:
        """Puts each parameter's data back; those written to out of sight, not restorable."""
        unrestorable = []
        with torch.no_grad():
            for (p, data, version), data_version in zip(
                self._params, self._data_versions, strict=True
            ):
                # Swapped for a half-precision copy: in-place writes went to the copy.
                swapped = p.dtype != data.dtype or p.data_ptr() != data.data_ptr()
                if p.data is not data:
                    p.data = data
                copy = self._saved.get(_storage(data))
                if copy is not None:
                    data.copy_(copy)
                elif (data._version != data_version) if swapped else (p._version != version):
                    unrestorable.append(p)
        return unrestorable

    def _restore_grads(self) -> None:
        failures: list[Exception] = []
        for p, grad, data in self._grads:
            try:
                if grad is not None and grad.data is not data:
                    grad.data = data
                if p.grad is not grad:
                    p.grad = grad
            except Exception as exc:  # the other parameters' gradients all the same
                failures.append(exc)
        if failures:
            raise failures[0]

    def _restore_requires_grad(self) -> None:
        for p, flag in self._requires_grad:
            if p.requires_grad != flag:
                p.requires_grad_(flag)

    def _restore_training(self) -> None:
        for m, flag in self._training:  # parents first: a parent's train() sets its children
            if m.training != flag:  # (each call recurses, and may be the user's override)
                with user_errors(None, f"its restore (train({flag}))"):
                    m.train(flag)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def cast_model(model: torch.nn.Module, dtype: torch.dtype) -> frozenset[str]:
    """``model.half()`` (``.bfloat16()``) as torch does it, through each module's ``_apply``, so
    a module that keeps itself in FP32 (an ``_apply`` override, as transformers'
    ``_keep_in_fp32_modules`` fixes do) stays so; ``ModelState`` restores what it converted.
    The names of the floating parameters and buffers it left in another dtype."""
    model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
    named = [*model.named_parameters(), *model.named_buffers()]
    return frozenset(n for n, t in named if t.is_floating_point() and t.dtype != dtype)


def to_dtype(
    model: torch.nn.Module, dtype: torch.dtype, only: frozenset[torch.dtype] | None = None
) -> None:
    """Floating parameters and buffers (of the dtypes ``only``, when given) to ``dtype`` in
    place (``ModelState`` restores them)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point() and (only is None or t.dtype in only):
                t.data = t.data.to(dtype)


@contextlib.contextmanager
def without_inference_tensors(model: torch.nn.Module) -> Iterator[None]:
    """A model built or loaded inside ``torch.inference_mode()`` holds inference tensors, which
    have no version counter and can be neither written to in place nor saved for a backward
    outside that mode: for the scan, each such parameter and buffer is replaced in its module by
    a normal copy (same values, ``requires_grad``, one copy per tensor shared between modules),
    and the original objects, untouched, are put back after."""
    swapped: list[tuple[dict[str, torch.Tensor | None], str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}
    try:
        with torch.inference_mode(False):
            for m in model.modules():
                for slots in (m._parameters, m._buffers):
                    for name, t in list(slots.items()):
                        if t is None or not t.is_inference():
                            continue
                        if id(t) not in copies:
                            copies[id(t)] = _normal_copy(t)
                        swapped.append((slots, name, t))
                        slots[name] = copies[id(t)]
        yield
    finally:
        for slots, name, t in reversed(swapped):
            slots[name] = t


def _normal_copy(t: torch.Tensor) -> torch.Tensor:
    copy = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=t.requires_grad)
    return copy
