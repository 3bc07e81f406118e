"""What the re-run of a step scans: the plain module behind a framework's wrappers, and a copy
of it that can run on one rank without the others."""

from __future__ import annotations

import copy
from typing import Any

import torch

from nan_hunter.loader import unwrap_model


def unwrap_training_objects(
    model: torch.nn.Module, optimizer: Any, scaler: Any
) -> tuple[torch.nn.Module, Any, Any]:
    """The plain module, torch optimizer and GradScaler behind what a framework hands out:
    accelerate's ``AcceleratedOptimizer`` (its ``.optimizer``, and its ``.scaler`` when no
    scaler is given: a step pre-hook on the wrapper itself fails), DDP and ``torch.compile``
    wrappers around the model (``unwrap_model``)."""
    module, _ = unwrap_model(model)
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and type(optimizer).__name__ == (
        "AcceleratedOptimizer"
    ):
        if scaler is None:
            scaler = getattr(optimizer, "scaler", None)
        optimizer = inner
    return module, optimizer, scaler


def replay_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` to re-run; a forward that accelerate wrapped (autocast, outputs
    converted to FP32) is put back to the module's own, so the scan applies its own precision."""
    replay = copy.deepcopy(module)
    if replay.__dict__.pop("_original_forward", None) is not None:
        replay.__dict__.pop("forward", None)  # back to the class's forward
    return replay


def sharded(module: torch.nn.Module) -> bool:
    """FSDP inside ``module`` (an FSDP1 wrapper, an FSDP2 ``fully_shard`` module or a DTensor
    parameter): its forward gathers parameters across ranks, so a re-run on one rank would
    wait for the others forever."""
    if any("FSDP" in type(sub).__name__ or type(sub).__name__ == "FullyShardedDataParallel"
           for sub in module.modules()):
        return True
    return any(type(p).__name__ in ("DTensor", "FlatParameter") for p in module.parameters())


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of an FSDP module, on the CPU. A collective: every rank
    must call it at the same point."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu() for k, v in state.items()}
