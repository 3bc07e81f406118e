"""A seeded generator of small model files that FP16 breaks, for the fix search.

Each generated model combines

* a **culprit** (``CULPRITS``): ``overflow`` (a forward matmul/mul beyond 65504: unscaled
  attention scores, ``torch.inverse`` then a matmul, ``x * x`` in a hand-written norm),
  ``eps`` (``x / torch.sqrt(var + 1e-8)`` with a zero variance), ``clamp`` (a bound FP16 cannot
  hold: ``clamp(max=1e5)``, ``1 - 1e-5`` rounding to 1.0, ``log(p.clamp(min=1e-10))``), ``mask``
  (``masked_fill(mask, -1e9)`` or ``+ (1 - mask) * -1e9`` on a fully masked row) or
  ``backward`` (finite forward, inf gradient: ``x.pow(-3)`` near 0, ``sqrt`` of flushed
  squares, ``atan2`` of tiny values);
* an **arrival** (``ARRIVALS``): how the culprit's operands reach it: a tensor attribute (buffer
  or parameter), a Python float attribute, an int from ``.size()``/``.shape``, a
  sub-expression, the result of a module call, or a helper class in another file of a package;
* a **mode**: ``autocast`` (the default scan) or ``half`` (``--mode half``).

Names, sizes and constants vary with the seed (``random.Random(seed)``), so a shape is not one
template. ``generate()`` gives every combination that makes sense; ``sample()`` a small set
that covers every culprit, arrival and mode. Every model must fail the plain scan (exit 1 with
an error finding): ``tests/test_fix_generalisation.py`` checks it, and a model that does not
fail is a bug of this generator.

``python -m tests.fix_shapes.generator --report`` runs ``nan-hunter scan FILE --fix-all
--format json`` on every model (in-process) and prints one line per model and the pass rates.

Each model also has a hand-written **minimal fix**, one template per culprit shape (``MINIMAL``):
the overflowing matmul alone in FP32 (attention scores, the solve after an inverse), or a
change that moves no matmul/conv FLOPs to FP32 (the eps, the bound, the mask constant
changed; an elementwise op in FP32). A model is **lean** when it ends clean and the files
``--fix-all`` left keep no more of the matmul/conv FLOPs in FP32 than the hand-fixed model does,
plus ``LEAN_MARGIN`` (2 points): both measured by scanning the files (``Report.precision``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nan_hunter.findings import Report

CULPRITS = ("overflow", "eps", "clamp", "mask", "backward")
ARRIVALS = ("tensor_attr", "float_attr", "size_int", "subexpr", "module_call", "package")
MODES = ("autocast", "half")

# The shapes of each culprit, and the modes a shape makes sense in (the inverse example keeps
# its solve in FP32 by hand: in half mode its FP32 result meets an FP16 Linear, a dtype error,
# not a precision bug).
SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    "overflow": {"attention": MODES, "inverse": ("autocast",), "square": MODES},
    "eps": {"rsqrt_var": MODES},
    "clamp": {"clamp_max": MODES, "one_minus": MODES, "log_floor": MODES},
    "mask": {"masked_fill": MODES, "additive": MODES},
    "backward": {"pow": MODES, "sqrt": MODES, "atan2": MODES},
}

# Combinations left out, and why: the set stays one of models that do fail in FP16 (a
# combination that does not is no test of the fix search).
EXCLUDED: dict[tuple[str, str, str, str], str] = {
    ("mask", "masked_fill", "tensor_attr", "half"): (
        "not a failure: .half() turns the buffer -1e10 into -inf, and masked_fill(mask, -inf) "
        "then a softmax over rows never fully masked stay finite in FP16 too (NH005 warns)"
    ),
}


@dataclass(frozen=True)
class GeneratedModel:
    id: str
    culprit: str
    shape: str
    arrival: str
    mode: str
    seed: int
    entry: str
    """The model file, relative to the model's folder."""
    files: dict[str, str] = field(hash=False)
    """Every file of the model (relative path -> text)."""
    minimal_files: dict[str, str] | None = field(default=None, hash=False)
    """The files with the hand-written minimal fix (``MINIMAL``); None where no fix short of
    changing the model keeps any FP16 (half-mode ``clamp_max``)."""
    minimal_changes_numerics: bool = False
    """The hand-written fix changes a constant: not held to the FP32 loss."""
    fallback_files: dict[str, str] | None = field(default=None, hash=False)
    """A wider hand-written fix, the minimal one for the seeds where ``minimal_files`` does
    not scan clean."""

    def write(self, folder: Path, files: dict[str, str] | None = None) -> Path:
        """Write the files (``files``, else the model's) under ``folder``; returns the model
        file."""
        for rel, text in (files or self.files).items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return folder / self.entry

    @property
    def args(self) -> list[str]:
        """The scan options besides the path (the mode)."""
        return ["--mode", self.mode] if self.mode != "autocast" else []


# --------------------------------------------------------------------------------------------
# Building blocks


class _Names:
    """Varied identifiers, drawn once per model."""

    def __init__(self, rng: random.Random) -> None:
        pick = rng.choice
        self.net = pick(["Net", "Model", "Encoder", "Tower", "Backbone", "Stack"])
        self.blk_attr = pick(["block", "core", "layer", "mixer", "unit"])
        self.head = pick(["head", "out", "readout", "classifier"])
        self.h = pick(["h", "hidden", "feats", "z"])
        self.pkg = pick(["mypkg", "netlib", "blocks", "modelkit"])
        self.module_file = pick(["model", "net", "train_model", "arch"])


def _fmt(value: float) -> str:
    """A constant as a user would type it (``1e-08`` -> ``1e-8``, ``20.0``)."""
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        mantissa, exp = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exp)}"
    text = repr(round(value, 4))
    return text if "." in text or "e" in text else text + ".0"


@dataclass
class _Block:
    """The culprit's module: its class source, how the net calls it, and the batch."""

    cls: str
    """Class name of the block."""
    source: str
    """Source of the block class (and any helper it needs)."""
    ctor: str
    """Constructor call, e.g. ``Attn(64)``."""
    d_in: int
    d_out: int
    batch: str
    """Body of ``sample_batch()`` after the seed (returns the batch)."""
    extra_args: str = ""
    """Extra forward parameters after ``x`` (``, mask``)."""
    minimal: tuple[tuple[str, str], ...] = ()
    """The hand-written minimal fix as ``(old, new)`` replacements of ``source`` (each
    occurrence replaced)."""
    fp32_head: bool = False
    """The minimal fix also runs the parent's head in FP32 (the block's result is beyond
    FP16's range)."""
    fallback: tuple[tuple[str, str], ...] = ()
    """A wider hand-written fix, for the seeds where ``minimal`` does not verify (the Linear's
    own FP16 output flushes to 0; FP16's rounding before the region moves the loss)."""
    changes_numerics: bool = False
    """The hand-written fix changes a constant (an eps, a mask value): it moves no FLOPs, and
    is not held to the FP32 loss."""
    minimal_fails: bool = False
    """No fix short of changing the model keeps any FP16 (the model cannot be lean)."""


MINIMAL: dict[str, str] = {
    "attention": "the scores matmul alone in FP32 (half mode: its softmax cast back)",
    "inverse": "the solve's matmul alone in FP32",
    "square": "an elementwise op: no matmul FLOPs in FP32",
    "rsqrt_var": "the eps changed (1e-4): none in FP32",
    "clamp_max": "the bound changed: none in FP32",
    "one_minus": "the constant changed: none in FP32",
    "log_floor": "the floor changed: none in FP32",
    "masked_fill": "the mask constant changed: none in FP32",
    "additive": "the mask constant changed: none in FP32",
    "pow": "an elementwise op: no matmul FLOPs in FP32",
    "sqrt": "an elementwise op: no matmul FLOPs in FP32",
    "atan2": "an elementwise op: no matmul FLOPs in FP32",
}
"""The template of each culprit shape's hand-written minimal fix."""

LEAN_MARGIN = 0.02
"""A fix is lean when it keeps at most this much more of the matmul/conv FLOPs in FP32 than
the hand-written minimal fix."""

_NO_AUTOCAST = 'with torch.autocast(device_type="cuda", enabled=False):'


def _in_fp32(statement: str, mode: str, operands: tuple[str, ...]) -> str:
    """``statement`` with ``operands`` upcast; under autocast, in an autocast-off block."""
    for name in operands:
        if name.endswith(")"):  # a module's result: ``self.q_proj(x)``
            statement = statement.replace(name, f"{name}.float()")
        else:  # a name: ``q``, not ``q_proj`` nor ``self.q``
            statement = re.sub(rf"(?<![.\w]){name}(?![\w(])", f"{name}.float()", statement)
    if mode == "half":
        return statement
    return f"{_NO_AUTOCAST}\n    {statement}"


def _indent(text: str, n: int) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), " " * n) + "\n"


_FORWARD = "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"


def _elementwise_fp32(calls: Iterable[str], use: str, mode: str) -> tuple[tuple[str, str], ...]:
    """The hand-written fix that moves no matmul FLOPs: each Linear's result upcast where the
    block reads it (``self.fc(x).float()``), so the elementwise ops after it run in FP32; under
    ``.half()`` the block's result cast back to its input's dtype."""
    edits = [(call, f"{call}.float()") for call in calls]
    if mode == "half":
        value = use.removeprefix("return ")
        edits.append((use, f"return ({value}).to(x.dtype)"))
    return tuple(edits)


def _whole_block_fp32(mode: str) -> tuple[tuple[str, str], ...]:
    """The hand-written fix where the block's own Linear must run in FP32 (its gradient is
    beyond FP16's range): autocast disabled for the block with FP32 inputs; under ``.half()``
    the block keeps its parameters in FP32 (an ``_apply`` override) and casts its result back."""
    inner = "    def _fp32_forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    if mode == "half":
        outer = (
            "    def _apply(self, fn, recurse=True):\n"
            "        super()._apply(fn, recurse)\n"
            "        for p in self.parameters():\n"
            "            p.data = p.data.float()\n"
            "        return self\n\n"
            + _FORWARD
            + "        return self._fp32_forward(x.float()).to(x.dtype)\n\n"
        )
    else:
        outer = (
            _FORWARD
            + f"        {_NO_AUTOCAST}\n"
            + "            return self._fp32_forward(x.float())\n\n"
        )
    return ((_FORWARD, outer + inner),)


# --------------------------------------------------------------------------------------------
# Culprits. Each returns a _Block for an arrival; ``None`` when the pair makes no sense.


def _attention(rng: random.Random, arrival: str, mode: str) -> _Block:
    cls = rng.choice(["Attention", "SelfAttn", "AttnBlock", "Mixer"])
    d = rng.choice([32, 48, 64])
    seq = rng.choice([8, 12, 16])
    bsz = rng.choice([2, 3])
    qn, kn, vn = rng.choice([("q_proj", "k_proj", "v_proj"), ("query", "key", "value"),
                             ("wq", "wk", "wv")])
    sc = rng.choice(["scores", "logits", "att", "weights"])
    # With nn.init.normal_ on q/k (std 1) and an input of std sigma, q and k have std
    # sigma * sqrt(d) and a score has std sigma**2 * d**1.5.
    big = rng.uniform(1.2e5, 3e5)  # the target std of the overflowing scores
    init = f"nn.init.normal_(self.{qn}.weight)\nnn.init.normal_(self.{kn}.weight)"
    pre = ""
    extra_init = ""
    if arrival in ("subexpr", "tensor_attr", "float_attr", "size_int"):
        # scores of std ~s0 stay finite in FP16; the factor makes them overflow
        s0 = rng.uniform(1500, 4000)
        sigma = math.sqrt(s0 / d**1.5)
        factor = big / s0
        if arrival == "subexpr":
            c = max(2, round(math.sqrt(factor)))
            # (q * c) @ (k * c): the factor enters as a sub-expression of the operands
            expr = rng.choice([f"(q * {c}) @ (k * {c}).transpose(-2, -1)",
                               f"(q * {c * c}) @ k.transpose(-2, -1)"])
            line = f"{sc} = {expr}"
        elif arrival == "tensor_attr":
            t = round(factor, 1)
            if rng.random() < 0.5:
                extra_init = f'\nself.register_buffer("temperature", torch.tensor({t}))'
            else:
                extra_init = f"\nself.temperature = nn.Parameter(torch.tensor({t}))"
            line = f"{sc} = (q @ k.transpose(-2, -1)) * self.temperature"
        elif arrival == "float_attr":
            t = round(factor, 1)
            attr = rng.choice(["temperature", "gain", "logit_scale"])
            extra_init = f"\nself.{attr} = {t}"
            line = rng.choice([f"{sc} = q @ k.transpose(-2, -1) * self.{attr}",
                               f"{sc} = (q * self.{attr}) @ k.transpose(-2, -1)"])
        else:  # size_int: the wrong exponent multiplies by sqrt(d) instead of dividing
            heads = rng.choice([1, 2, 4])
            hd = d // heads
            # a score: std sigma**2 * d * sqrt(hd), times sqrt(hd)
            sigma = math.sqrt(big / (d * hd))
            if heads == 1:
                pre = "dim = x.size(-1)\n"
                line = f"{sc} = q @ k.transpose(-2, -1) / dim ** -0.5"
            else:
                pre = (f"bsz, seq, dim = x.shape\n"
                       f"q = q.view(bsz, seq, {heads}, dim // {heads}).transpose(1, 2)\n"
                       f"k = k.view(bsz, seq, {heads}, dim // {heads}).transpose(1, 2)\n"
                       f"v = v.view(bsz, seq, {heads}, dim // {heads}).transpose(1, 2)\n")
                line = f"{sc} = q @ k.transpose(-2, -1) / k.size(-1) ** -0.5"
        if arrival == "size_int" and heads > 1:
            post = (f"out = {sc}.softmax(-1) @ v\n"
                    f"return out.transpose(1, 2).reshape(bsz, seq, dim)")
        else:
            post = f"return {sc}.softmax(-1) @ v"
        body = f"q = self.{qn}(x)\nk = self.{kn}(x)\nv = self.{vn}(x)\n{pre}{line}\n{post}"
    else:
        sigma = math.sqrt(big / d**1.5)
        if arrival == "module_call":
            body = (f"{sc} = self.{qn}(x) @ self.{kn}(x).transpose(-2, -1)\n"
                    f"return {sc}.softmax(-1) @ self.{vn}(x)")
        else:  # package: the plain unscaled attention, in another file
            body = (f"q = self.{qn}(x)\nk = self.{kn}(x)\nv = self.{vn}(x)\n"
                    f"{sc} = q @ k.transpose(-2, -1)\nreturn {sc}.softmax(-1) @ v")
    source = f"""
class {cls}(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.{qn} = nn.Linear(d, d)
        self.{kn} = nn.Linear(d, d)
        self.{vn} = nn.Linear(d, d)
{_indent(init + extra_init, 8)}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(body, 8)}"""
    batch = f"return torch.randn({bsz}, {seq}, {d}) * {sigma:.3g}"
    scores = next(ln for ln in body.splitlines() if ln.startswith(f"{sc} = "))
    operands = (f"self.{qn}(x)", f"self.{kn}(x)") if arrival == "module_call" else ("q", "k")
    minimal = [(scores, _in_fp32(scores, mode, operands).replace("\n", "\n        "))]
    if mode == "half":
        minimal.append((f"{sc}.softmax(-1) @", f"{sc}.softmax(-1).to(x.dtype) @"))
    # where FP16's rounding of q and k alone moves the near one-hot softmax (the loss leaves
    # the FP32 one), the projections must run in FP32 too: the whole block
    return _Block(cls, source, f"{cls}({d})", d, d, batch, minimal=tuple(minimal),
                  fallback=_whole_block_fp32(mode))


def _inverse(rng: random.Random, arrival: str, mode: str) -> _Block:
    cls = rng.choice(["SparseCoder", "RidgeEncoder", "DictSolve"])
    n_sig = rng.choice([48, 64, 80])
    n_atoms = rng.choice([24, 32])
    dn = rng.choice(["dictionary", "atoms", "basis"])
    lam = rng.choice([1e-6, 1e-7])
    gap = rng.choice([1e-4, 2e-4])
    inv = rng.choice(["dtd_inv", "gram_inv", "precision"])
    extra_init = ""
    solve = f"{inv} = torch.inverse(dtd + {_fmt(lam)} * eye)\ncodes = torch.matmul({inv}, z)"
    eye = f"eye = torch.eye({n_atoms}, device=x.device, dtype=dtd.dtype)"
    if arrival == "float_attr":
        extra_init = f"\nself.lam = {_fmt(lam)}"
        solve = "codes = torch.inverse(dtd + self.lam * eye) @ z"
    elif arrival == "size_int":
        eye = "n = d.size(1)\neye = torch.eye(n, device=x.device, dtype=dtd.dtype)"
        solve = f"{inv} = torch.inverse(dtd + {_fmt(lam)} * eye)\ncodes = {inv} @ z.view(n, -1)"
    elif arrival == "subexpr":
        solve = f"codes = torch.matmul(torch.inverse(dtd + {_fmt(lam)} * eye), z * 1.0)"
    elif arrival == "tensor_attr":
        extra_init = f'\nself.register_buffer("ridge", torch.eye({n_atoms}) * {_fmt(lam)})'
        eye = ""
        solve = f"{inv} = torch.inverse(dtd + self.ridge)\ncodes = {inv} @ z"
    zline = "z = d.t() @ x.float().t()"
    if arrival == "module_call":
        extra_init = f"\nself.enc = nn.Linear({n_sig}, {n_sig})"
        zline = "z = d.t() @ x.float().t()"
        solve = (f"{inv} = torch.inverse(dtd + {_fmt(lam)} * eye)\n"
                 f"codes = torch.matmul({inv}, self.{dn}.t() @ self.enc(x).t())")
    body = f"""
with torch.autocast(device_type=x.device.type, enabled=False):
    d = self.{dn}.float()
    dtd = d.t() @ d
    {zline}
{eye}
{solve}
return self.head(codes.t())"""
    source = f"""
class {cls}(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = torch.randn({n_sig}, {n_atoms}) * 0.1
        d[:, 1] = d[:, 0] + {_fmt(gap)} * torch.randn({n_sig})
        self.{dn} = nn.Parameter(d)
        self.head = nn.Linear({n_atoms}, {n_atoms})
{_indent(extra_init, 8) if extra_init else ""}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(body, 8)}"""
    bsz = rng.choice([4, 6])
    codes = next(ln for ln in solve.splitlines() if ln.startswith("codes = "))
    return _Block(cls, source, f"{cls}()", n_sig, n_atoms,
                  f"return torch.randn({bsz}, {n_sig})",
                  minimal=((codes, f"{_NO_AUTOCAST}\n            {codes}"),))


def _square(rng: random.Random, arrival: str, mode: str) -> _Block:
    """``x * x`` in a hand-written RMS/layer norm, on FP16 activations of a few hundred."""
    cls = rng.choice(["RMSNorm", "ManualNorm", "ScaleNorm", "HandNorm"])
    d = rng.choice([16, 24, 32])
    bsz = rng.choice([2, 4])
    eps = rng.choice([1e-5, 1e-6])
    mag = rng.uniform(400, 900)  # the activation's std: its square overflows
    lin = rng.choice(["fc", "proj", "inp"])
    init = f"self.{lin} = nn.Linear(d, d)\nself.weight = nn.Parameter(torch.ones(d))"
    g = round(rng.uniform(20, 40), 1)
    if arrival == "tensor_attr":
        init += rng.choice([f'\nself.register_buffer("gain", torch.tensor({g}))',
                            f"\nself.gain = nn.Parameter(torch.tensor({g}))"])
        head = f"h = self.{lin}(x) * self.gain\nms = (h * h).mean(-1, keepdim=True)"
        sigma = mag / g
    elif arrival == "float_attr":
        init += f"\nself.gain = {g}"
        head = f"h = self.{lin}(x) * self.gain\nms = (h * h).mean(-1, keepdim=True)"
        sigma = mag / g
    elif arrival == "size_int":
        head = (f"bsz = x.size(0)\nh = self.{lin}(x).view(bsz, -1)\n"
                f"ms = (h * h).mean(-1, keepdim=True)")
        sigma = mag
    elif arrival == "subexpr":
        head = (f"h = self.{lin}(x)\nmu = h.mean(-1, keepdim=True)\n"
                f"ms = ((h - mu) * (h - mu)).mean(-1, keepdim=True)")
        sigma = mag
    elif arrival == "module_call":
        head = (f"h = self.{lin}(x)\n"
                f"ms = (self.{lin}(x) * self.{lin}(x)).mean(-1, keepdim=True)")
        sigma = mag
    else:
        head = f"h = self.{lin}(x)\nms = (h * h).mean(-1, keepdim=True)"
        sigma = mag
    # nn.Linear's default init: an output has std ~ input std / sqrt(3)
    sigma *= math.sqrt(3)
    body = f"{head}\nreturn h * torch.rsqrt(ms + {_fmt(eps)}) * self.weight"
    source = f"""
class {cls}(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
{_indent(init, 8)}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(body, 8)}"""
    use = f"return h * torch.rsqrt(ms + {_fmt(eps)}) * self.weight"
    return _Block(cls, source, f"{cls}({d})", d, d,
                  f"return torch.randn({bsz}, {d}) * {sigma:.3g}",
                  minimal=_elementwise_fp32([f"self.{lin}(x)"], use, mode))


def _eps(rng: random.Random, arrival: str, mode: str) -> _Block:
    """``x / torch.sqrt(var + 1e-8)``: the Linear's last group is all zeros, its var is 0."""
    cls = rng.choice(["GroupNorm", "Standardize", "Whiten", "GroupScale"])
    groups = rng.choice([2, 4])
    gsize = rng.choice([4, 8])
    d = groups * gsize
    bsz = rng.choice([2, 4])
    eps = rng.choice([1e-8, 1e-9, 1e-10])
    lin = rng.choice(["fc", "proj", "lin"])
    var = rng.choice(["var", "v", "variance"])
    init = (f"self.{lin} = nn.Linear(d_in, {d})\n"
            f"with torch.no_grad():\n"
            f"    self.{lin}.weight[-{gsize}:].zero_()\n"
            f"    self.{lin}.bias[-{gsize}:].zero_()")
    grouped = f"h = self.{lin}(x).reshape(x.shape[0], {groups}, {gsize})"
    stat = (f"{var} = ((h - h.mean(-1, keepdim=True)) * (h - h.mean(-1, keepdim=True)))"
            ".mean(-1, keepdim=True)")
    stat = rng.choice([stat, f"{var} = h.var(-1, keepdim=True, unbiased=False)"])
    center = "hc = h - h.mean(-1, keepdim=True)"
    tail = f"return y.reshape(x.shape[0], {d})"
    if arrival == "tensor_attr":
        init += f'\nself.register_buffer("eps", torch.tensor({_fmt(eps)}))'
        core = f"{center}\n{stat}\ny = hc / torch.sqrt({var} + self.eps)"
    elif arrival == "float_attr":
        init += f"\nself.eps = {_fmt(eps)}"
        core = f"{center}\n{stat}\ny = hc / torch.sqrt({var} + self.eps)"
    elif arrival == "size_int":
        grouped = (f"bsz = x.size(0)\nh = self.{lin}(x).reshape(bsz, {groups}, -1)\n"
                   f"n = h.size(-1)")
        core = (f"{center}\n{var} = (hc * hc).mean(-1, keepdim=True) * n / (n - 1)\n"
                f"y = hc / torch.sqrt({var} + {_fmt(eps)})")
        tail = "return y.reshape(bsz, -1)"
    elif arrival == "subexpr":
        core = (f"y = (h - h.mean(-1, keepdim=True)) / torch.sqrt("
                f"h.var(-1, keepdim=True, unbiased=False) + {_fmt(eps)})")
    elif arrival == "module_call":
        init += f"\nself.stat = {cls}Stat()"
        core = f"{center}\ny = hc / torch.sqrt(self.stat(h) + {_fmt(eps)})"
    else:
        core = f"{center}\n{stat}\ny = hc / torch.sqrt({var} + {_fmt(eps)})"
    helper = ""
    if arrival == "module_call":
        helper = f"""
class {cls}Stat(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.var(-1, keepdim=True, unbiased=False)

"""
    d_in = rng.choice([6, 8])
    source = f"""{helper}
class {cls}(nn.Module):
    def __init__(self, d_in: int) -> None:
        super().__init__()
{_indent(init, 8)}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(grouped + chr(10) + core + chr(10) + tail, 8)}"""
    # the eps FP16 holds (as a normal number): the zero group's 0 / sqrt(0 + eps) stays 0
    return _Block(cls, source, f"{cls}({d_in})", d_in, d,
                  f"return torch.randn({bsz}, {d_in})",
                  minimal=((_fmt(eps), "1e-4"),), changes_numerics=True)


def _clamp(shape: str) -> Callable[[random.Random, str, str], _Block]:
    def build(rng: random.Random, arrival: str, mode: str) -> _Block:
        cls = rng.choice(["Gate", "ProbHead", "Bounded", "Squash"])
        d = rng.choice([8, 12, 16])
        bsz = rng.choice([2, 4])
        lin = rng.choice(["fc", "score", "lin"])
        init = f"self.{lin} = nn.Linear(d, d)"
        helper = ""
        if shape == "clamp_max":
            # exp of logits near 12 is ~1.6e5; the clamp bound (1e5 or more) is above 65504, so
            # it keeps values FP16 cannot hold: the next FP16 op (the Linear, or the exp itself
            # in half mode) overflows; in FP32 everything is finite
            const = rng.choice([1e5, 2e5, 1e6])
            bias = rng.choice([11.5, 12.0, 12.5])
            init += (f"\nwith torch.no_grad():\n    self.{lin}.weight.mul_(0.05)\n"
                     f"    self.{lin}.bias.fill_({bias})\nself.mix = nn.Linear(d, d)")
            use = "return self.mix(c)"
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("cap", torch.tensor({_fmt(const)}))'
                core = f"e = torch.exp(self.{lin}(x))\nc = torch.clamp(e, max=self.cap)"
            elif arrival == "float_attr":
                init += f"\nself.cap = {_fmt(const)}"
                core = (f"e = torch.exp(self.{lin}(x))\n"
                        "c = torch.clamp(e, min=-self.cap, max=self.cap)")
            elif arrival == "size_int":
                core = (f"e = torch.exp(self.{lin}(x))\nn = e.size(-1)\n"
                        f"c = torch.clamp(e, max=n * {_fmt(const / d)})")
            elif arrival == "subexpr":
                core = f"c = torch.clamp(torch.exp(self.{lin}(x) * 1.0), max={_fmt(const)})"
            elif arrival == "module_call":
                core = f"c = self.{lin}(x).exp().clamp(max={_fmt(const)})"
            else:
                core = f"e = torch.exp(self.{lin}(x))\nc = torch.clamp(e, max={_fmt(const)})"
        elif shape == "one_minus":
            # sigmoid of logits near 12 is 0.99999 in FP32, 1.0 in FP16; 1 - 1e-5 is 1.0 too
            tiny = rng.choice([1e-5, 1e-6, 1e-7])
            bias = rng.choice([11.0, 12.0, 13.0])
            init += (f"\nwith torch.no_grad():\n    self.{lin}.weight.fill_(0.0)\n"
                     f"    self.{lin}.bias.fill_({bias})")
            use = rng.choice(["return torch.log(1 - c)", "return torch.log1p(-c)"])
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("top", torch.tensor(1 - {_fmt(tiny)}))'
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(max=self.top)"
            elif arrival == "float_attr":
                init += f"\nself.eps = {_fmt(tiny)}"
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(max=1 - self.eps)"
            elif arrival == "size_int":
                core = (f"p = torch.sigmoid(self.{lin}(x))\nn = p.size(-1)\n"
                        f"c = p.clamp(max=1 - 1 / (n * {_fmt(1 / (tiny * d))}))")
            elif arrival == "subexpr":
                core = f"c = torch.sigmoid(self.{lin}(x) * 1.0).clamp(max=1 - {_fmt(tiny)})"
            elif arrival == "module_call":
                init = init.replace(f"self.{lin} = nn.Linear(d, d)",
                                    f"self.{lin} = nn.Sequential(nn.Linear(d, d), nn.Sigmoid())")
                init = init.replace(f"self.{lin}.weight", f"self.{lin}[0].weight")
                init = init.replace(f"self.{lin}.bias", f"self.{lin}[0].bias")
                core = f"c = self.{lin}(x).clamp(max=1 - {_fmt(tiny)})"
            else:
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(max=1 - {_fmt(tiny)})"
        else:  # log_floor: sigmoid(-20) is 2e-9 in FP32, 0 in FP16; the floor 1e-10 is 0 too
            floor = rng.choice([1e-10, 1e-9, 1e-12])
            bias = rng.choice([-20.0, -19.0, -22.0])
            init += (f"\nwith torch.no_grad():\n    self.{lin}.weight.fill_(0.0)\n"
                     f"    self.{lin}.bias.fill_({bias})")
            use = "return torch.log(c)"
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("floor", torch.tensor({_fmt(floor)}))'
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(min=self.floor)"
            elif arrival == "float_attr":
                init += f"\nself.floor = {_fmt(floor)}"
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(min=self.floor)"
            elif arrival == "size_int":
                core = (f"p = torch.sigmoid(self.{lin}(x))\n"
                        f"c = p.clamp(min=1.0 / (p.size(-1) * {_fmt(1 / (floor * d))}))")
            elif arrival == "subexpr":
                core = f"c = torch.sigmoid(self.{lin}(x) * 1.0).clamp(min={_fmt(floor)})"
            elif arrival == "module_call":
                init = init.replace(f"self.{lin} = nn.Linear(d, d)",
                                    f"self.{lin} = nn.Sequential(nn.Linear(d, d), nn.Sigmoid())")
                init = init.replace(f"self.{lin}.weight", f"self.{lin}[0].weight")
                init = init.replace(f"self.{lin}.bias", f"self.{lin}[0].bias")
                core = f"c = self.{lin}(x).clamp(min={_fmt(floor)})"
            else:
                core = f"p = torch.sigmoid(self.{lin}(x))\nc = p.clamp(min={_fmt(floor)})"
        source = f"""{helper}
class {cls}(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
{_indent(init, 8)}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(core + chr(10) + use, 8)}"""
        if shape == "clamp_max":
            if mode == "half":
                # values of 1e5 cannot come back to FP16 for the parent's head: no fix keeps
                # any FP16 short of changing the model (a bound far below 65504)
                return _Block(cls, source, f"{cls}({d})", d, d,
                              f"return torch.randn({bsz}, {d})", minimal_fails=True)
            # exp and clamp in FP32; the Linears taking values beyond 65504 (``mix``, and the
            # parent's head after it) in FP32, the block's own Linear in FP16
            mix = "return self.mix(c)"
            minimal = (*_elementwise_fp32([f"self.{lin}(x)"], use, mode),
                       (mix, f"{_NO_AUTOCAST}\n            {mix}"))
            return _Block(cls, source, f"{cls}({d})", d, d, f"return torch.randn({bsz}, {d})",
                          minimal=minimal, fp32_head=True)
        call = f"self.{lin}(x)"
        minimal = _elementwise_fp32([call], use, mode)
        if arrival == "module_call":  # nn.Sequential(Linear, Sigmoid): the sigmoid in FP32
            minimal = ((call, f"torch.sigmoid(self.{lin}[0](x).float())"), *minimal[1:])
        return _Block(cls, source, f"{cls}({d})", d, d, f"return torch.randn({bsz}, {d})",
                      minimal=minimal)

    return build


def _mask(shape: str) -> Callable[[random.Random, str, str], _Block]:
    def build(rng: random.Random, arrival: str, mode: str) -> _Block:
        cls = rng.choice(["MaskedAttention", "PaddedAttn", "CausalAttn", "Attend"])
        d = rng.choice([16, 24, 32])
        seq = rng.choice([6, 8, 10])
        bsz = rng.choice([2, 3])
        const = rng.choice([-1e9, -1e10, -1e12])
        sc = rng.choice(["scores", "logits", "att"])
        init = "self.qk = nn.Linear(d, 2 * d)\nself.d = d"
        qk = "q, k = self.qk(x).chunk(2, dim=-1)"
        raw = f"{sc} = q @ k.transpose(-2, -1) / self.d ** 0.5"
        causal = False
        if shape == "masked_fill":
            # mask: (B, S, S), 1 = keep; the fill value cannot be converted to FP16
            cond = "mask == 0"
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("neg", torch.tensor({_fmt(const)}))'
                fill = f"{sc} = {sc}.masked_fill({cond}, self.neg)"
            elif arrival == "float_attr":
                attr = rng.choice(["mask_value", "neg_inf", "fill"])
                init += f"\nself.{attr} = {_fmt(const)}"
                fill = f"{sc} = {sc}.masked_fill({cond}, self.{attr})"
            elif arrival == "size_int":
                causal = True
                fill = (f"seq = x.size(1)\n"
                        f"causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, "
                        f"device=x.device), 1)\n"
                        f"{sc} = {sc}.masked_fill(causal, {_fmt(const)})")
            elif arrival == "subexpr":
                raw = ""
                fill = (f"{sc} = (q @ k.transpose(-2, -1) / self.d ** 0.5)"
                        f".masked_fill({cond}, {_fmt(const)})")
            elif arrival == "module_call":
                init = f"self.score = {cls}Score(d)"
                qk = ""
                raw = ""
                fill = f"{sc} = self.score(x).masked_fill({cond}, {_fmt(const)})"
            else:
                fill = f"{sc} = {sc}.masked_fill({cond}, {_fmt(const)})"
        else:
            # additive: mask (B, S) of 1 = real token, 0 = padding; a padded sample's rows are
            # all masked: in FP32 a uniform softmax, in FP16 -inf everywhere, then NaN
            cast = "m = mask.to(scores.dtype)".replace("scores", sc)
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("neg", torch.tensor({_fmt(const)}))'
                fill = f"{cast}\n{sc} = {sc} + (1.0 - m)[:, None, :] * self.neg"
            elif arrival == "float_attr":
                init += f"\nself.neg = {_fmt(const)}"
                fill = f"{cast}\n{sc} = {sc} + (1.0 - m)[:, None, :] * self.neg"
            elif arrival == "size_int":
                fill = (f"{cast}\nseq = x.size(1)\n"
                        f"{sc} = {sc} + (1.0 - m).view(-1, 1, seq) * {_fmt(const)}")
            elif arrival == "subexpr":
                fill = f"{sc} = {sc} + ({_fmt(const)}) * (1.0 - mask.to({sc}.dtype))[:, None, :]"
            elif arrival == "module_call":
                init = f"self.score = {cls}Score(d)"
                qk = ""
                raw = ""
                fill = (f"{sc} = self.score(x)\n{cast}\n"
                        f"{sc} = {sc} + (1.0 - m)[:, None, :] * {_fmt(const)}")
            else:
                fill = f"{cast}\n{sc} = {sc} + (1.0 - m)[:, None, :] * {_fmt(const)}"
        helper = ""
        if arrival == "module_call":
            helper = f"""
class {cls}Score(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qk = nn.Linear(d, 2 * d)
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        return q @ k.transpose(-2, -1) / self.d ** 0.5

"""
        body = "\n".join(s for s in (qk, raw, fill) if s) + f"\nreturn {sc}.softmax(-1) @ x"
        args = "" if causal else ", mask: torch.Tensor"
        source = f"""{helper}
class {cls}(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
{_indent(init, 8)}
    def forward(self, x: torch.Tensor{args}) -> torch.Tensor:
{_indent(body, 8)}"""
        if causal:
            batch = f"return torch.randn({bsz}, {seq}, {d})"
        elif shape == "masked_fill":
            batch = (f"mask = torch.tril(torch.ones({seq}, {seq})).expand({bsz}, {seq}, {seq})\n"
                     f"return torch.randn({bsz}, {seq}, {d}), mask")
        else:
            batch = (f"mask = torch.ones({bsz}, {seq})\n"
                     "mask[-1] = 0.0  # a sample of padding only\n"
                     f"return torch.randn({bsz}, {seq}, {d}), mask")
        # the mask constant FP16 holds, finite after the ops that follow it
        return _Block(cls, source, f"{cls}({d})", d, d, batch,
                      extra_args="" if causal else ", mask", minimal=((_fmt(const), "-1e4"),),
                      changes_numerics=True)

    return build


def _backward(shape: str) -> Callable[[random.Random, str, str], _Block]:
    def build(rng: random.Random, arrival: str, mode: str) -> _Block:
        cls = rng.choice(["Energy", "InvPower", "Angle", "Radial", "Potential"])
        d = rng.choice([8, 12, 16])
        bsz = rng.choice([2, 4])
        lin = rng.choice(["fc", "proj", "enc"])
        init = f"self.{lin} = nn.Linear(d, d)"
        helper = ""
        if shape == "pow":
            # (|h| + a) ** p with a small: the forward stays below 65504, the gradient
            # |p| * f / a does not (in half mode x ** (p - 1) inside the backward overflows too)
            p = rng.choice([-1, -0.5] + ([-3] if mode == "half" else []))
            a = {-1: rng.uniform(4e-4, 6e-4), -0.5: rng.uniform(5e-6, 1e-5),
                 -3: rng.uniform(0.035, 0.045)}[p]
            a = float(f"{a:.2g}")
            init += (f"\nwith torch.no_grad():\n    self.{lin}.weight.mul_(1e-6)\n"
                     f"    self.{lin}.bias.zero_()")
            pw = f".pow({p})"
            if arrival == "tensor_attr":
                init += f'\nself.register_buffer("shift", torch.tensor({a}))'
                core = f"h = self.{lin}(x)\ne = (h.abs() + self.shift){pw}"
            elif arrival == "float_attr":
                init += f"\nself.shift = {a}"
                core = f"h = self.{lin}(x)\ne = (h.abs() + self.shift){pw}"
            elif arrival == "size_int":
                core = (f"h = self.{lin}(x)\nn = h.size(-1)\n"
                        f"e = (h.abs() + {float(f'{a * d:.3g}')} / n){pw}")
            elif arrival == "subexpr":
                core = f"e = (self.{lin}(x).abs() * 0.5 + {a}){pw}"
            elif arrival == "module_call":
                core = f"e = self.{lin}(x).abs().add({a}){pw}"
            else:
                core = f"h = self.{lin}(x)\ne = (h.abs() + {a}){pw}"
            use = "return e"
        elif shape == "sqrt":
            # h ~ 1e-5: h * h is 1e-10 in FP32 and 0 in FP16, where sqrt's gradient is inf
            init += (f"\nwith torch.no_grad():\n    self.{lin}.weight.mul_(1e-5)\n"
                     f"    self.{lin}.bias.zero_()")
            if arrival == "tensor_attr":
                init += '\nself.register_buffer("scale", torch.tensor(1.0))'
                core = f"h = self.{lin}(x)\nr = torch.sqrt(h * h * self.scale)"
            elif arrival == "float_attr":
                init += "\nself.scale = 1.0"
                core = f"h = self.{lin}(x)\nr = torch.sqrt(h * h * self.scale)"
            elif arrival == "size_int":
                core = (f"h = self.{lin}(x)\nn = h.size(-1)\n"
                        f"r = torch.sqrt(h * h * n / n)")
            elif arrival == "subexpr":
                core = f"r = torch.sqrt(self.{lin}(x) * self.{lin}(x))"
            elif arrival == "module_call":
                init += f"\nself.energy = {cls}Sq()"
                core = f"h = self.{lin}(x)\nr = torch.sqrt(self.energy(h))"
                helper = f"""
class {cls}Sq(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * h

"""
            else:
                core = f"h = self.{lin}(x)\nr = torch.sqrt(h * h)"
            use = "return r * 1e4"
        else:  # atan2 of small values: d/du = w / (u**2 + w**2) ~ 1 / r, r ~ 3e-4; times the
            # output's scale (1000) the gradient passes 65504: inf in FP16, finite in FP32
            k = rng.choice([2e-4, 3e-4])
            init = (f"self.{lin} = nn.Linear(d, 2 * d)\n"
                    f"with torch.no_grad():\n    self.{lin}.weight.mul_({k})\n"
                    f"    self.{lin}.bias.zero_()")
            split = f"u, w = self.{lin}(x).chunk(2, dim=-1)"
            if arrival == "tensor_attr":
                init += '\nself.register_buffer("scale", torch.tensor(1.0))'
                core = f"{split}\na = torch.atan2(u * self.scale, w)"
            elif arrival == "float_attr":
                init += "\nself.scale = 1.0"
                core = f"{split}\na = torch.atan2(u * self.scale, w)"
            elif arrival == "size_int":
                core = (f"h = self.{lin}(x)\nn = h.size(-1) // 2\n"
                        f"a = torch.atan2(h[..., :n], h[..., n:])")
            elif arrival == "subexpr":
                core = f"{split}\na = torch.atan2(u * 1.0, w + 0.0)"
            elif arrival == "module_call":
                init = (f"self.{lin}_u = nn.Linear(d, d)\nself.{lin}_w = nn.Linear(d, d)\n"
                        f"with torch.no_grad():\n"
                        f"    for m in (self.{lin}_u, self.{lin}_w):\n"
                        f"        m.weight.mul_({k})\n        m.bias.zero_()")
                core = f"a = torch.atan2(self.{lin}_u(x), self.{lin}_w(x))"
            else:
                core = f"{split}\na = torch.atan2(u, w)"
            use = f"return a * {rng.choice([1000.0, 2000.0])}"
        source = f"""{helper}
class {cls}(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
{_indent(init, 8)}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{_indent(core + chr(10) + use, 8)}"""
        if shape == "sqrt":
            # the gradient into the Linear is ~1e4: FP16 holds it; sqrt and the squares in FP32
            # (where the Linear's FP16 output itself flushes a value to 0, the Linear too)
            return _Block(cls, source, f"{cls}({d})", d, d, f"return torch.randn({bsz}, {d})",
                          minimal=_elementwise_fp32([f"self.{lin}(x)"], use, mode),
                          fallback=_whole_block_fp32(mode))
        # the gradient into the Linear's output is beyond 65504 even in FP32: the Linear
        # itself must run (and keep its weights) in FP32
        return _Block(cls, source, f"{cls}({d})", d, d, f"return torch.randn({bsz}, {d})",
                      minimal=_whole_block_fp32(mode))

    return build


BUILDERS: dict[tuple[str, str], Callable[[random.Random, str, str], _Block]] = {
    ("overflow", "attention"): _attention,
    ("overflow", "inverse"): _inverse,
    ("overflow", "square"): _square,
    ("eps", "rsqrt_var"): _eps,
    ("clamp", "clamp_max"): _clamp("clamp_max"),
    ("clamp", "one_minus"): _clamp("one_minus"),
    ("clamp", "log_floor"): _clamp("log_floor"),
    ("mask", "masked_fill"): _mask("masked_fill"),
    ("mask", "additive"): _mask("additive"),
    ("backward", "pow"): _backward("pow"),
    ("backward", "sqrt"): _backward("sqrt"),
    ("backward", "atan2"): _backward("atan2"),
}


HEADER = (
    '"""Generated by tests/fix_shapes/generator.py: {id} '
    '({culprit}/{shape}, {arrival}, {mode})."""\n\n'
)


def build(culprit: str, shape: str, arrival: str, mode: str, seed: int) -> GeneratedModel:
    """One model file (and its package, for the ``package`` arrival)."""
    rng = random.Random(f"{culprit}/{shape}/{arrival}/{mode}/{seed}")
    names = _Names(rng)
    block = BUILDERS[(culprit, shape)](rng, arrival, mode)
    mid = f"{culprit}-{shape}-{arrival}-{mode}-{seed}"
    imports = "import torch\nfrom torch import nn\n"
    files: dict[str, str] = {}
    header = HEADER.format(id=mid, culprit=culprit, shape=shape, arrival=arrival, mode=mode)
    minimal_source = _replaced(block.source, block.minimal, mid)
    fallback_source = _replaced(block.source, block.fallback, mid)
    minimal: dict[str, str] = {}
    fallback: dict[str, str] = {}
    if arrival == "package":
        pkg = f"{names.pkg}_{zlib.crc32(mid.encode()) % 10**6:06d}"
        files[f"{pkg}/__init__.py"] = ""
        files[f"{pkg}/layers.py"] = header + imports + "\n" + block.source.rstrip() + "\n"
        minimal[f"{pkg}/layers.py"] = header + imports + "\n" + minimal_source.rstrip() + "\n"
        fallback[f"{pkg}/layers.py"] = (header + imports + "\n" + fallback_source.rstrip()
                                        + "\n")
        imports += f"\nfrom {pkg}.layers import {block.cls}\n"
        block_source = ""
    else:
        block_source = block.source.rstrip() + "\n"
    h = names.h
    extra = block.extra_args
    net = f"""

class {names.net}(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.{names.blk_attr} = {block.ctor}
        self.{names.head} = nn.Linear({block.d_out}, {rng.choice([2, 3, 4])})

    def forward(self, x: torch.Tensor{extra and ", mask: torch.Tensor"}) -> torch.Tensor:
        {h} = self.{names.blk_attr}(x{extra})
        return self.{names.head}({h})


def build_model() -> nn.Module:
    torch.manual_seed({seed})
    return {names.net}()


def sample_batch():
    torch.manual_seed({seed})
{_indent(block.batch, 4)}"""
    entry = f"{names.module_file}_{zlib.crc32(mid.encode()) % 10**6:06d}.py"
    files[entry] = header + imports + "\n" + block_source + net
    minimal_net = net
    if block.fp32_head:
        head_call = f"return self.{names.head}({h})"
        minimal_net = net.replace(
            head_call,
            f"{_NO_AUTOCAST}\n            return self.{names.head}({h}.float())",
        )
    if arrival == "package":
        minimal = {**files, **minimal, entry: files[entry].replace(net, minimal_net)}
        fallback = {**files, **fallback, entry: files[entry].replace(net, minimal_net)}
    else:
        minimal = {**files, entry: header + imports + "\n" + minimal_source.rstrip() + "\n"
                   + minimal_net}
        fallback = {**files, entry: header + imports + "\n" + fallback_source.rstrip()
                    + "\n" + minimal_net}
    return GeneratedModel(mid, culprit, shape, arrival, mode, seed, entry, files,
                          None if block.minimal_fails else minimal, block.changes_numerics,
                          fallback if block.fallback else None)


def _replaced(source: str, edits: tuple[tuple[str, str], ...], mid: str) -> str:
    for old, new in edits:
        assert old in source, (mid, old)
        source = source.replace(old, new)
    return source


def generate(variants: int = 2) -> list[GeneratedModel]:
    """Every combination that makes sense, ``variants`` seeds each."""
    models = []
    for culprit in CULPRITS:
        for shape, modes in SHAPES[culprit].items():
            for arrival in ARRIVALS:
                for mode in modes:
                    if (culprit, shape, arrival, mode) in EXCLUDED:
                        continue
                    for seed in range(variants):
                        models.append(build(culprit, shape, arrival, mode, seed))
    return models


def sample() -> list[GeneratedModel]:
    """12 models covering every culprit, every arrival and both modes."""
    picks = [
        ("overflow", "attention", "module_call", "autocast"),
        ("overflow", "inverse", "float_attr", "autocast"),
        ("overflow", "square", "size_int", "half"),
        ("eps", "rsqrt_var", "float_attr", "autocast"),
        ("eps", "rsqrt_var", "package", "half"),
        ("clamp", "clamp_max", "tensor_attr", "autocast"),
        ("clamp", "log_floor", "subexpr", "half"),
        ("clamp", "one_minus", "size_int", "autocast"),
        ("mask", "masked_fill", "float_attr", "autocast"),
        ("mask", "additive", "subexpr", "autocast"),
        ("backward", "pow", "tensor_attr", "half"),
        ("backward", "atan2", "package", "autocast"),
    ]
    return [build(c, s, a, m, 0) for c, s, a, m in picks]


# --------------------------------------------------------------------------------------------
# Running the scans


@dataclass
class Outcome:
    model: GeneratedModel
    plain_code: int
    """Exit code of the plain scan."""
    plain_errors: list[str]
    """``CODE op (module)`` of each error finding of the first scan."""
    verified: list[dict]
    """The first scan's error findings whose fix is verified."""
    code: int
    """Exit code of ``--fix-all``."""
    remaining: list[str]
    """``CODE op (module) line`` of each error finding left after ``--fix-all``."""
    error_line: str
    stopped: str
    verified_but_failing: list[str]
    seconds: float
    fixed_fp32: float | None = None
    """The share of the forward's matmul/conv FLOPs in FP32 in the files ``--fix-all`` left."""
    minimal_fp32: float | None = None
    """The same share in the hand-fixed model (``MINIMAL``)."""
    minimal_errors: list[str] = field(default_factory=list)
    """The error findings of a plain scan of the hand-fixed model: none, or the hand-written
    fix is no fix (a bug of this generator)."""
    minimal_note: str = ""
    """Why no hand-written fix counts (they scan clean but change the FP32 loss)."""

    @property
    def lean(self) -> bool:
        """Clean, at no more FP32 than the hand-written minimal fix plus ``LEAN_MARGIN``."""
        return (
            self.result == "clean" and self.fixed_fp32 is not None
            and self.minimal_fp32 is not None
            and self.fixed_fp32 <= self.minimal_fp32 + LEAN_MARGIN
        )

    @property
    def minimal_fixes(self) -> bool:
        """The hand-written minimal fix scans clean (True where the model has none)."""
        return not self.minimal_errors

    @property
    def fails_plain(self) -> bool:
        """The model is what it should be: the plain scan exits 1 with an error finding."""
        return self.plain_code == 1 and bool(self.plain_errors)

    @property
    def result(self) -> str:
        if self.verified_but_failing:
            return "verified-but-failing"
        return {0: "clean", 1: "still-failing"}.get(self.code, "error")

    def line(self) -> str:
        m = self.model
        if self.result == "clean":
            detail = ""
        elif self.result == "error":
            detail = self.error_line
        elif self.result == "verified-but-failing":
            detail = "; ".join(self.verified_but_failing)
        else:
            detail = "; ".join(self.remaining[:2]) + (f" [{self.stopped}]" if self.stopped else "")
        return f"{m.id:45s} {m.culprit:8s} {m.arrival:11s} {m.mode:8s} {self.result:20s} {detail}"


# What keeps a model from ending clean, by the text of the stop reason or error line (first match)
FAILURE_KINDS: tuple[tuple[str, str], ...] = (
    ("verified-but-failing", "a fix labelled verified left its op failing"),
    ("NH401: no automatic fix", "backward-only overflow (NH401): no automatic fix"),
    ("'float' object has no attribute 'float'",
     "cast on a Python float: AttributeError 'float' object has no attribute 'float'"),
    ("object has no attribute 'dtype'",
     "finfo of an unparenthesised receiver (`torch.finfo(q @ k.t() / self.d ** 0.5.dtype)`): "
     "AttributeError 'float' object has no attribute 'dtype'"),
    ("only supports boolean masks",
     "the FP32 region casts masked_fill's bool mask: 'masked_fill_ only supports boolean masks'"),
    ("expected m1 and m2 to have the same dtype",
     "half mode: no cast back, the FP32 result meets an FP16 tensor in the same return "
     "expression (`return scores.softmax(-1) @ v`): matmul dtype mismatch, not verified"),
    ("but got Float and Half",
     "half mode: no cast back at the block's end, the FP32 result reaches the parent's FP16 "
     "nn.Linear (mat1 Float, mat2 Half): not verified"),
    ("but got Half and Float",
     "half mode: the fix casts back (`.to(torch.float16)`) yet the re-scan's next nn.Linear "
     "meets FP32 weights (mat1 Half, mat2 Float): not verified"),
    ("same dtype", "half mode: dtype mismatch after the FP32 region: not verified"),
    ("new: the original scan did not have it",
     "the FP32 region moves the overflow to the next FP16 op (a new finding at the consumer)"),
    ("the fixed op still fails",
     "the region casts `(var + 1e-8).float()` after the FP16 add: the eps is already 0, "
     "the op still fails"),
    ("NH104: no automatic fix",
     "NH104 with the constant in a Python float attribute (`self.neg = -1e9`): no automatic fix"),
)


def failure_kind(outcome: Outcome) -> str:
    """The one-line kind of a model that does not end clean ("" when it does)."""
    if outcome.result == "clean":
        return ""
    text = " ".join([outcome.result, outcome.error_line, outcome.stopped, *outcome.remaining])
    for needle, kind in FAILURE_KINDS:
        if needle in text:
            return kind
    if outcome.result == "error":
        return f"error (exit {outcome.code}): {outcome.error_line}"
    return f"other: {outcome.stopped or '; '.join(outcome.remaining[:1])}"


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from nan_hunter.cli import app

    runner = CliRunner()
    return runner.invoke(app, args, env={"COLUMNS": "200", "NAN_HUNTER_IN_PROCESS": "1"})


def _key(f: dict) -> tuple[str, str]:
    return (f.get("op", ""), f.get("module", ""))


def _describe(f: dict) -> str:
    loc = f.get("location") or {}
    return f"{f['code']} {f['op']} ({f.get('module') or '-'}) `{(loc.get('code') or '').strip()}`"


def run_model(model: GeneratedModel, folder: Path | None = None) -> Outcome:
    """The plain scan (``--format json``: exit code, error findings, which fixes it labelled
    verified), then ``--fix-all --format json`` on a fresh copy, both in this process."""
    own = folder is None
    base = Path(tempfile.mkdtemp(prefix="nh-gen-")) if own else folder
    assert base is not None
    start = time.perf_counter()
    try:
        path = model.write(base / "plain")
        res = _invoke(["scan", str(path), "--format", "json", "-q", *model.args])
        plain_code = res.exit_code
        verified: list[dict] = []
        if plain_code in (0, 1):
            first = [f for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"]
            plain_errors = [_describe(f) for f in first]
            verified = [f for f in first if (f.get("fix") or {}).get("verified") is True]
        else:
            plain_errors = [_error_line(res)]
        path = model.write(base / "fix")
        res = _invoke(["scan", str(path), "--fix-all", "--no-backup", "--format", "json", "-q",
                       *model.args])
        code = res.exit_code
        remaining: list[dict] = []
        error_line = ""
        if code in (0, 1):
            remaining = [f for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"]
        else:
            error_line = _error_line(res)
        stopped = ""
        for line in res.stderr.splitlines():
            if "--fix-all stopped:" in line:
                stopped = line.split("--fix-all stopped:", 1)[1].strip()
        left = {_key(f) for f in remaining}
        vbf = [f"{_describe(f)} verified, still failing" for f in verified if _key(f) in left]
        fixed = minimal = None
        minimal_errors: list[str] = []
        if code == 0:
            fixed, _ = fp32_matmul_share(path, model.mode)
        minimal_note = ""
        if model.minimal_files is not None:
            minimal, minimal_errors, minimal_note = minimal_share(model, base)
        return Outcome(model, plain_code, plain_errors, verified, code,
                       [_describe(f) for f in remaining], error_line, stopped, vbf,
                       time.perf_counter() - start, fixed, minimal, minimal_errors,
                       minimal_note)
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


def minimal_share(model: GeneratedModel, base: Path) -> tuple[float | None, list[str], str]:
    """The FP32 matmul/conv share of the first hand-written fix (``minimal_files``, then
    ``fallback_files``) that verifies as nan-hunter's own fixes must: its scan has no error,
    and its loss stays within the verification tolerance of the original model's FP32 loss
    (except a constant change, which moves no FLOPs). Returns ``(share, errors, note)``:
    ``errors`` when no hand-written fix scans clean (a bug of this generator), ``share`` None
    and a ``note`` when they scan clean but none keeps the loss."""
    from nan_hunter.api import scan_file
    from nan_hunter.fixes.verify import loss_change
    from nan_hunter.project.config import load_settings

    errors: list[str] = []
    notes: list[str] = []
    plain: Report | None = None  # the original model's FP32 loss: scanned when first needed
    for name, files in (("minimal", model.minimal_files), ("fallback", model.fallback_files)):
        if files is None:
            continue
        share, found, report = _measure(model.write(base / name, files), model.mode)
        if found:
            errors = errors or found
            continue
        changed = None
        if not model.minimal_changes_numerics:
            if plain is None:
                plain = scan_file(str(model.write(base / "plain-again")),
                                  load_settings(overrides={"mode": model.mode}), verify=False)
            changed = loss_change(plain, report)
        if changed is None:
            return share, [], ""
        errors = []
        notes.append(f"{name}: {changed}")
    return None, errors, "; ".join(notes)


def fp32_matmul_share(path: Path, mode: str) -> tuple[float | None, list[str]]:
    """The share of the forward's matmul/conv FLOPs that ran in FP32 in a plain scan of
    ``path`` (``Report.precision``; None when the scan has none), and the scan's error
    findings (``CODE op (module) `line```)."""
    share, errors, _ = _measure(path, mode)
    return share, errors


def _measure(path: Path, mode: str) -> tuple[float | None, list[str], Report]:
    from nan_hunter.api import scan_file
    from nan_hunter.findings import Severity
    from nan_hunter.project.config import load_settings

    report = scan_file(str(path), load_settings(overrides={"mode": mode}), verify=False)
    errors = [
        f"{f.code} {f.op} ({f.module or '-'}) `{(f.location.code if f.location else '').strip()}`"
        for f in report.findings if f.severity is Severity.ERROR
    ]
    work = report.precision
    if work is None:
        return None, errors, report
    share = work.fp32_matmul_flops / work.matmul_flops if work.matmul_flops else 0.0
    return share, errors, report


def _error_line(res) -> str:
    text = (res.stderr or "") + (res.stdout or "")
    for line in text.splitlines():
        if line.startswith("nan-hunter: error"):
            return line
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return f"exception: {type(res.exception).__name__}: {res.exception}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {res.exit_code}"


def _lean_note(o: Outcome) -> str:
    """`` FP32 10.8% (minimal 10.8%)`` after a clean model's line."""
    if o.fixed_fp32 is None or o.minimal_fp32 is None:
        return ""
    mark = "" if o.lean else " NOT LEAN"
    return f" FP32 {100 * o.fixed_fp32:.1f}% (minimal {100 * o.minimal_fp32:.1f}%){mark}"


def rates(outcomes: Iterable[Outcome], key: Callable[[GeneratedModel], str]) -> dict[str, str]:
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(key(o.model), []).append(o)
    return {
        k: f"{sum(o.result == 'clean' for o in v)}/{len(v)}"
        f" ({100 * sum(o.result == 'clean' for o in v) / len(v):.0f}%)"
        for k, v in groups.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fix_shapes.generator")
    parser.add_argument("--report", action="store_true", help="run every model, print results")
    parser.add_argument("--sample", action="store_true", help="only the 12-model sample")
    parser.add_argument("--variants", type=int, default=3, help="seeds per combination")
    parser.add_argument("--only", default="", help="substring of model ids to run")
    parser.add_argument("--write", metavar="DIR", help="write the models under DIR")
    args = parser.parse_args(argv)
    models = sample() if args.sample else generate(args.variants)
    models = [m for m in models if args.only in m.id]
    if args.write:
        for m in models:
            m.write(Path(args.write) / m.id)
        print(f"wrote {len(models)} models under {args.write}")
        return 0
    if not args.report:
        for m in models:
            print(m.id)
        return 0
    os.environ["NAN_HUNTER_IN_PROCESS"] = "1"
    outcomes = []
    start = time.perf_counter()
    for m in models:
        o = run_model(m)
        outcomes.append(o)
        plain = "" if o.fails_plain else (
            f" [GENERATOR BUG: plain scan exit {o.plain_code}, {o.plain_errors[:1]}]")
        if not o.minimal_fixes:
            plain += f" [GENERATOR BUG: the minimal fix leaves {o.minimal_errors[:1]}]"
        print(o.line() + plain + _lean_note(o) + f"  ({o.seconds:.1f}s)", flush=True)
    n = len(outcomes)
    clean = sum(o.result == "clean" for o in outcomes)
    lean = sum(o.lean for o in outcomes)
    print(f"\n{n} models in {time.perf_counter() - start:.0f}s; clean {clean}/{n} "
          f"({100 * clean / max(n, 1):.0f}%); lean {lean}/{n} ({100 * lean / max(n, 1):.0f}%: "
          f"clean at most {100 * LEAN_MARGIN:.0f} points of matmul/conv FLOPs in FP32 beyond "
          f"the hand-written minimal fix); verified-but-failing "
          f"{sum(o.result == 'verified-but-failing' for o in outcomes)}")
    for title, key in (("culprit", lambda m: m.culprit), ("shape", lambda m: m.shape),
                       ("arrival", lambda m: m.arrival), ("mode", lambda m: m.mode)):
        print(f"per {title}: " + ", ".join(f"{k} {v}" for k, v in rates(outcomes, key).items()))
    print("lean per mode: " + ", ".join(
        f"{mode} {sum(o.lean for o in outcomes if o.model.mode == mode)}/"
        f"{sum(o.model.mode == mode for o in outcomes)}" for mode in MODES))
    fat = [o for o in outcomes if o.result == "clean" and not o.lean]
    if fat:
        print("clean but not lean:")
        for o in fat:
            print(f"          {o.model.id}{_lean_note(o)}")
    results: dict[str, int] = {}
    for o in outcomes:
        results[o.result] = results.get(o.result, 0) + 1
    print("results: " + ", ".join(f"{k} {v}" for k, v in sorted(results.items())))
    kinds: dict[str, list[str]] = {}
    for o in outcomes:
        if o.result != "clean":
            kinds.setdefault(failure_kind(o), []).append(o.model.id)
    print("\nnot clean, by kind:")
    for kind, ids in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):4d}  {kind}")
        for mid in ids:
            print(f"          {mid}")
    print(f"\nleft out ({len(EXCLUDED)} combinations):")
    for combo, why in EXCLUDED.items():
        print(f"  {'-'.join(combo)}: {why}")
    bugs = [o.model.id for o in outcomes if not o.fails_plain or not o.minimal_fixes]
    if bugs:
        print(f"\nGENERATOR BUGS (the plain scan does not fail, or the hand-written minimal "
              f"fix does not fix it): {', '.join(bugs)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
