"""The model's inputs and the loss function's type: the value types the loader, the runner and
the training checks share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class Batch:
    """The model's inputs: ``model(*args, **kwargs)``; ``raw`` is what ``sample_batch`` gave."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    raw: Any

    def map(self, fn: Callable[[torch.Tensor], Any]) -> Batch:
        """A batch with ``fn`` applied to every tensor in it (other leaves kept as they are)."""

        def leaf(x: Any) -> Any:
            return fn(x) if isinstance(x, torch.Tensor) else x

        return Batch(
            args=tree_map(leaf, self.args), kwargs=tree_map(leaf, self.kwargs),
            raw=tree_map(leaf, self.raw),
        )

    def without_inference_tensors(self) -> Batch:
        """This batch, with a normal copy of each tensor made inside ``torch.inference_mode()``
        (one copy per tensor, shared where the batch shares it): outside that mode an inference
        tensor refuses an in-place write and being saved for the backward. The batch itself
        when it holds none."""
        copies: dict[int, torch.Tensor] = {}

        def normal(t: torch.Tensor) -> torch.Tensor:
            if not t.is_inference():
                return t
            if id(t) not in copies:
                with torch.inference_mode(False):
                    copies[id(t)] = t.clone()
            return copies[id(t)]

        mapped = self.map(normal)
        return mapped if copies else self
