"""The autocast policy tables: real ops, equal to the dispatcher's, matching AMP_FACTS.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from nan_hunter.precision.override import AutocastPolicyError, PolicyOverride
from nan_hunter.precision.policy import Cast, load_policy

AMP_FACTS = Path(__file__).resolve().parent / "data" / "AMP_FACTS.md"
"""A copy of the project's AMP facts, vendored so this check runs in any clone."""
SECTION_CASTS = {
    "Lower precision": Cast.LOWER,
    "FP32 (inputs": Cast.FP32,
    "FP32 unless": Cast.FP32_UNLESS_DTYPE,
    "Promote": Cast.PROMOTE,
    "Banned": Cast.BANNED,
}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_entry_is_a_real_aten_op(device: str) -> None:
    policy = load_policy(device)
    missing = [n for n in policy.casts if not getattr(torch.ops.aten, n).overloads()]
    assert missing == []


@pytest.mark.parametrize(("device", "key"), [("cuda", "AutocastCUDA"), ("cpu", "AutocastCPU")])
def test_tables_equal_the_dispatcher_registrations(device: str, key: str) -> None:
    """torch's own autocast kernels (registered even in a CPU build) are the ground truth."""
    registered = {
        entry.removeprefix("aten::").split(".")[0]
        for entry in torch._C._dispatch_get_registrations_for_dispatch_key(key)
        if entry.startswith("aten::")
    }
    assert set(load_policy(device).casts) == registered


def _expand(item: str) -> list[str]:
    """``conv1d/2d/3d`` -> conv1d, conv2d, conv3d; ``x(_transpose)`` -> x, x_transpose."""
    item = item.strip(" .`").removeprefix("and the losses: ")
    if "(" in item:
        base, suffix = item.rstrip(")").split("(")
        return [base, base + suffix]
    if "/" in item:
        first, *rest = item.split("/")
        stem = re.sub(r"\d+d$", "", first)
        return [first] + [stem + r for r in rest]
    return [item]


def _amp_facts_cuda_lists() -> dict[Cast, set[str]]:
    text = AMP_FACTS.read_text(encoding="utf-8")
    section = text.split("## CUDA autocast policy")[1].split("## CPU autocast policy")[0]
    lists: dict[Cast, set[str]] = {}
    for line in section.splitlines():
        for title, cast in SECTION_CASTS.items():
            if line.startswith(f"- **{title}"):
                body = line.split(":**", 1)[1].split(";")[0]
                body = re.sub(r"\s*\([^)]*\s[^)]*\)", "", body)  # asides such as (+ fused cells)
                names = {n for part in body.split(", ") for n in _expand(part.strip())}
                names |= set(re.findall(r";\s*(\w+) is redispatched in FP32", line))
                lists[cast] = {n for n in names if n}
    return lists


def test_cuda_table_matches_amp_facts() -> None:
    facts = _amp_facts_cuda_lists()
    assert set(facts) == set(SECTION_CASTS.values())
    policy = load_policy("cuda")
    for cast, names in facts.items():
        table = set(policy.ops(cast))
        plain = {n for n in names if not n.endswith("*")}
        assert plain <= table, (cast, sorted(plain - table))
        # what the table has beyond AMP_FACTS is spelled out there as a wildcard or an aside
        extra = table - plain
        allowed = [n.rstrip("*") for n in names if n.endswith("*")] + ["_thnn_fused_", "_upsample"]
        assert all(any(e.startswith(a) for a in allowed) for e in extra), (cast, sorted(extra))


def test_cuda_policy_on_cpu_casts_as_cuda_does() -> None:
    x = torch.randn(8, 8)
    xh = x.half()
    with torch.autocast("cpu", dtype=torch.float16), PolicyOverride(
        load_policy("cuda"), "cpu", torch.float16
    ):
        assert (x @ x).dtype == torch.float16  # lower precision
        assert torch.einsum("ij,jk->ik", x, x).dtype == torch.float16  # CUDA only
        assert xh.softmax(-1).dtype == torch.float32  # FP32 list on CUDA, unlisted on CPU
        assert xh.pow(2).dtype == torch.float32
        assert xh.sum().dtype == torch.float32
        assert xh.sum(dtype=torch.float16).dtype == torch.float16  # unless dtype=
        assert (xh * xh).dtype == torch.float16  # unlisted
        assert torch.addcmul(xh, xh, x).dtype == torch.float32  # promote
        with pytest.raises(RuntimeError, match="Low precision dtypes not supported"):
            torch.inverse(xh)  # FP32 on CPU autocast, but no FP16 kernel on CUDA
        with pytest.raises(AutocastPolicyError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(torch.sigmoid(x), torch.rand(8, 8))


def test_override_is_removed_on_exit() -> None:
    xh = torch.randn(8, 8).half()
    with PolicyOverride(load_policy("cuda"), "cpu", torch.float16):
        pass
    with torch.autocast("cpu", dtype=torch.float16):
        assert xh.softmax(-1).dtype == torch.float16  # CPU policy again
        assert torch.inverse(torch.eye(3)).dtype == torch.float32
