"""Which module is running: state_dict-style paths tracked with global module hooks.

The hooks are global (``torch.nn.modules.module.register_module_forward_*``), so the user's own
per-module hook dictionaries are never touched; they are removed when the tracker exits.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle


class ModuleTracker:
    """Keeps the stack of running modules of one model; ``current`` is the innermost path."""

    def __init__(
        self, model: torch.nn.Module, on_output: Callable[[Any], None] | None = None
    ) -> None:
        self._on_output = on_output
        """Called with each module's forward output (the tracer marks what leaves a module)."""
        self._names: dict[int, str] = {}
        for name, module in model.named_modules(remove_duplicate=False):
            self._names.setdefault(id(module), name)
        self._stack: list[str] = []
        self._handles: list[RemovableHandle] = []
        self.executed: list[str] = []
        """Module paths in the order their forward started (for error context)."""

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else ""

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self._names.get(id(module))
        if name is not None:
            self._stack.append(name)
            self.executed.append(name)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._on_output is not None:
            self._on_output(output)
        name = self._names.get(id(module))
        if name is not None and name in self._stack:
            # Pop down to this module: inner modules whose forward raised inside a caught
            # exception never ran their post hook.
            while self._stack.pop() != name:
                pass

    def reset(self) -> None:
        """Forget the stack (after an exception unwound the forward)."""
        self._stack.clear()

    def __enter__(self) -> ModuleTracker:
        from torch.nn.modules import module as module_mod

        self._handles = [
            module_mod.register_module_forward_pre_hook(self._pre),
            # Not always_call: after an exception the stack still names the failing module.
            module_mod.register_module_forward_hook(self._post),
        ]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
