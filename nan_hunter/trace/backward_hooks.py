"""The tracer's hooks on the autograd nodes of the traced outputs, for one backward: each
node's incoming and produced gradients go to the tracer, tied to the forward op that made the
node. The hooks run inside the model's backward: their own failures are ``InternalError``
(``errors.ours``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch.utils.hooks import RemovableHandle

from nan_hunter.errors import ours


class NodeHooks:
    """Installs a hook on each of ``nodes`` (node, forward op index) on entry, calling
    ``on_node(index, grad_inputs, grad_outputs)``; removes them on exit, then calls ``after``
    (the tracer reads back what its hooks queued)."""

    def __init__(
        self,
        nodes: Iterable[tuple[Any, int]],
        on_node: Callable[[int, Any, Any], None],
        after: Callable[[], None],
    ) -> None:
        self._nodes, self._on_node, self._after = nodes, on_node, after
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> None:
        for node, index in self._nodes:
            self._handles.append(node.register_hook(self._hook_for(index)))

    def _hook_for(self, index: int) -> Callable[[Any, Any], None]:
        on_node = self._on_node

        @ours
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            on_node(index, grad_inputs, grad_outputs)

        return hook

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._after()
