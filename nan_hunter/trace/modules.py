"""Which module is running: state_dict-style paths tracked with module hooks.

A global forward pre hook pushes the module; a forward hook registered last on each module pops
it after the user's own forward hooks ran. Everything is removed when the tracker exits, so the
user's hook dictionaries end as they began. The hooks run inside the model's call: their own
failures are ``InternalError`` (``errors.ours``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nan_hunter.errors import ours


class ModuleTracker:
    """Keeps the stack of running modules of one model; ``current`` is the innermost path."""

    def __init__(
        self, model: torch.nn.Module, on_output: Callable[[Any], None] | None = None
    ) -> None:
        self._on_output = on_output
        """Called with each module's forward output (the tracer marks what leaves a module)."""
        self._names: dict[int, str] = {}
        self._modules: list[torch.nn.Module] = []
        for name, module in model.named_modules(remove_duplicate=False):
            if id(module) not in self._names:
                self._names[id(module)] = name
                self._modules.append(module)
        self._stack: list[str] = []
        self._handles: list[RemovableHandle] = []
        self.executed: list[str] = []
        """Module paths in the order their forward started (for error context)."""

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else ""

    @ours
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self._names.get(id(module))
        if name is not None:
            self._stack.append(name)
            self.executed.append(name)

    @ours
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

    def release(self) -> None:
        """Forget the output callback (it refers back to the pass that made this tracker)."""
        self._on_output = None

    def __enter__(self) -> ModuleTracker:
        from torch.nn.modules import module as module_mod

        # The pre hook is global (it runs before the module's own pre hooks, so their ops are
        # the module's). The post hook is each module's own, registered last, so it runs after
        # the user's forward hooks, whose ops are then attributed to the module too; it is
        # removed on exit, leaving the user's hook dictionaries as they were. Not always_call:
        # after an exception the stack still names the failing module.
        self._handles = [module_mod.register_module_forward_pre_hook(self._pre)]
        try:
            self._handles.extend(m.register_forward_hook(self._post) for m in self._modules)
        except BaseException:
            self.__exit__(None, None, None)
            raise
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
