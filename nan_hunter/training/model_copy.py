"""What the re-run of a step scans: the plain module behind a framework's wrappers, and a copy
of it that can run on one rank without the others: a deep copy (``replay_copy``), or for an
FSDP2 model a plain module tree loaded with the full state every rank gathered
(``gather_full_state``, ``unsharded_copy``)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from nan_hunter.errors import first_line
from nan_hunter.project.loader import unwrap_model
from nan_hunter.training.distributed import Ranks, agree


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


def gather_full_state(
    module: torch.nn.Module | None, ranks: Ranks | None
) -> dict[str, torch.Tensor] | str | None:
    """For a re-run of a sharded ``module`` on one rank: its full state dict, gathered from
    every rank, for ``unsharded_copy``; a str says why there is none; None when ``module``
    (the step's model on this rank; None: none was seen) is not sharded. A collective: every
    rank calls it at the same step. The ranks first agree (one all-reduce) that every one of
    them holds a sharded model, so that all gather or none does. The gathered state is whole
    on every rank (in its device memory) until the re-run ends."""
    mine = module is not None and sharded(module)
    if ranks is not None:
        codes = agree(ranks, int(mine))
        if not any(codes):
            return None
        if not all(codes):
            return "FSDP shards the model's parameters, and not every rank holds it"
    elif not mine:
        return None
    assert module is not None
    if not copyable_unsharded(module):
        return ("FSDP1 (FullyShardedDataParallel) shards the model's parameters: only FSDP2 "
                "(fully_shard) models are re-run from their gathered state")
    try:
        return full_state(module)
    except Exception as exc:  # a sharding get_model_state_dict cannot gather
        return (f"FSDP shards the model's parameters and its full state could not be "
                f"gathered: {type(exc).__name__}: {first_line(exc)}")


def copyable_unsharded(module: torch.nn.Module) -> bool:
    """``unsharded_copy`` can copy ``module``: its sharding is FSDP2's (``fully_shard``), not
    FSDP1's wrapper and flat parameters, whose forward the copy would keep."""
    if any(type(sub).__name__ == "FullyShardedDataParallel" for sub in module.modules()):
        return False
    return not any(type(p).__name__ == "FlatParameter" for p in module.parameters())


def _distributed(obj: Any) -> bool:
    """``obj`` (a hook, an attribute's value) belongs to ``torch.distributed`` (FSDP's state
    and hooks, tensor parallelism's)."""
    target = obj.func if isinstance(obj, functools.partial) else obj
    owner = getattr(target, "__self__", None)
    names = (getattr(target, "__module__", None) or "", type(target).__module__,
             type(owner).__module__ if owner is not None else "")
    return any(name.startswith("torch.distributed.") for name in names)


def _plain_class(module: torch.nn.Module) -> type:
    """The module's own class: FSDP2's ``fully_shard`` swaps ``module.__class__`` for a
    ``FSDP<Name>`` subclass of ``FSDPModule`` and the original class."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
          "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
          "_load_state_dict_post_hooks")
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called")
_TREE = ("_parameters", "_buffers", "_modules", *_HOOKS, *_HOOK_FLAGS)


def unsharded_copy(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain copy of the FSDP2 module ``module`` that runs on one rank: the same module tree
    with each module's own class (not FSDP's), without torch.distributed's hooks and state,
    its parameters the full tensors of ``state`` (``full_state``, keyed by parameter name),
    its buffers copies of the module's; every other attribute deep-copied, references between
    modules and tied parameters kept. Its forward issues no collective."""
    memo: dict[int, Any] = {}
    named = list(module.named_modules())
    for _, sub in named:
        cls = _plain_class(sub)
        memo[id(sub)] = cls.__new__(cls)
    for prefix, sub in named:
        for name, p in sub._parameters.items():
            if p is not None and id(p) not in memo:
                full = state[f"{prefix}.{name}" if prefix else name]
                memo[id(p)] = torch.nn.Parameter(full.detach().clone(),
                                                 requires_grad=p.requires_grad)
    for _, sub in named:
        copy_ = memo[id(sub)]
        attrs = {k: v for k, v in sub.__dict__.items()
                 if k not in _TREE and not k.startswith("__composable_api_state_key_")
                 and not k.startswith("_fsdp") and k != "_is_fsdp_managed_module"
                 and not _distributed(v)}
        copy_.__dict__.update(copy.deepcopy(attrs, memo))
        copy_._parameters = {k: None if p is None else memo[id(p)]
                             for k, p in sub._parameters.items()}
        copy_._buffers = {k: None if b is None else b.detach().clone()
                          for k, b in sub._buffers.items()}
        copy_._modules = {k: None if m is None else memo[id(m)] for k, m in sub._modules.items()}
        for hooks in _HOOKS:
            kept = {i: h for i, h in getattr(sub, hooks).items() if not _distributed(h)}
            setattr(copy_, hooks, type(getattr(sub, hooks))(kept))
        for flags in _HOOK_FLAGS:
            source = getattr(sub, flags)
            setattr(copy_, flags, type(source)(
                (i, v) for i, v in source.items()
                if any(i in getattr(copy_, h) for h in _HOOKS)))
    return memo[id(module)]
