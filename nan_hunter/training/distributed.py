"""Agreement across the ranks of a torch.distributed run: one small all-reduce per step.

Each rank puts a code for its own step in its slot of a ``world_size`` vector (0: fine,
1: a problem seen in the gradients or the loss scale, which an all-reduce may have carried in
from another rank, 2: its own loss went non-finite) and the vector is summed across ranks; every
rank then knows, at the same ``w.step()`` call, whether any rank saw a problem and which. Only on
a problem step do the ranks exchange more: the origin's report, gathered as pickled bytes (no
model tensors). The re-scan itself runs on each rank's own copy of the unwrapped module and
issues no collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

OK, SEEN, OWN = 0, 1, 2
"""Per-rank codes: nothing, a problem in the gradients/scale, the rank's own loss."""

ReportTo = Literal["rank0", "all"]
REPORT_TO: tuple[ReportTo, ...] = ("rank0", "all")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    device: torch.device
    """Where the flag lives: the current CUDA device under NCCL, else the CPU."""


def current_ranks() -> Ranks | None:
    """The default process group when one is initialised with more than one rank, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    backend = str(dist.get_backend()).lower()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if "nccl" in backend and torch.cuda.is_available()
        else torch.device("cpu")
    )
    return Ranks(dist.get_rank(), world, device)


def agree(ranks: Ranks, code: int) -> list[int]:
    """Every rank's code for this step (one all-reduce of ``world_size`` int32)."""
    import torch.distributed as dist

    flags = torch.zeros(ranks.world_size, dtype=torch.int32, device=ranks.device)
    flags[ranks.rank] = code
    dist.all_reduce(flags)
    return [int(v) for v in flags.tolist()]


def scanning_ranks(codes: Sequence[int]) -> list[int]:
    """Who re-runs its step: the first rank whose own loss went non-finite; without one, every
    rank (only a scan of each batch tells whose batch broke the gradients: in DDP every rank
    sees the all-reduced NaN, under FSDP only the ranks whose gradient shard holds it)."""
    own = [r for r, c in enumerate(codes) if c >= OWN]
    if own:
        return own[:1]
    return list(range(len(codes)))


def exchange(ranks: Ranks, payload: Any, report_to: ReportTo) -> list[Any] | None:
    """Each rank's ``payload`` (pickled, not tensors) on rank 0 or on every rank; None on the
    ranks that receive nothing. The pickled bytes travel as padded uint8 tensors after one
    all-gather of their lengths: torch's ``*_object`` collectives need NumPy, which the torch
    wheel does not install."""
    import pickle

    import torch
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    data = torch.frombuffer(bytearray(pickle.dumps(payload)), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(ranks.world_size)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=device))
    lengths = [int(size.item()) for size in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    buffers = [torch.empty_like(padded) for _ in range(ranks.world_size)]
    if report_to == "all":
        dist.all_gather(buffers, padded)
    else:
        dist.gather(padded, buffers if ranks.rank == 0 else None, dst=0)
        if ranks.rank != 0:
            return None
    return [
        pickle.loads(bytes(buffer[:n].cpu().tolist()))
        for buffer, n in zip(buffers, lengths, strict=True)
    ]


def choose_origin(codes: Sequence[int], has_error: Sequence[bool | None]) -> int | None:
    """The origin rank: the first whose own loss went non-finite, else the first whose scan
    found an error, else the first that scanned at all (``has_error`` is None where a rank did
    not scan or its scan failed)."""
    own = [r for r, c in enumerate(codes) if c >= OWN]
    if own:
        return own[0]
    erring = [r for r, e in enumerate(has_error) if e]
    if erring:
        return erring[0]
    scanned = [r for r, e in enumerate(has_error) if e is not None]
    return scanned[0] if scanned else None


def settle(
    ranks: Ranks, codes: Sequence[int], report: Any, report_to: ReportTo
) -> tuple[Any, int | None]:
    """After the scanning ranks re-ran their step (``report``: this rank's, or None), every rank
    at the same call: the reports gathered (``exchange``), the origin chosen; returns the
    origin's report as this rank receives it, and the origin rank (None when unknown here)."""
    gathered = exchange(ranks, report, report_to)
    if gathered is not None:
        has_error = [None if r is None else r.errors > 0 for r in gathered]
        origin = choose_origin(codes, has_error)
        return (gathered[origin] if origin is not None else None), origin
    # not a receiving rank: it knows the origin only when a rank's own loss broke
    origin = choose_origin(codes, [None] * len(codes)) if OWN in codes else None
    if origin is None or origin == ranks.rank:
        return report, origin
    return None, origin


def rank_path(path: str, ranks: Ranks | None) -> str:
    """``--output``-style name per rank: ``nan.json`` -> ``nan.rank1.json`` (unchanged in a
    single process)."""
    if ranks is None:
        return path
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{ranks.rank}{p.suffix}"))
