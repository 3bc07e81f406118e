"""The fix search on code shapes no single fixture covers: casts only on FP16 tensors (never on a
Python number, whichever side of the operator it stands and wherever it was assigned), and the
whole function in FP32 when no narrower region can be made or verified."""

from __future__ import annotations

import ast
import itertools
import textwrap
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Finding, Fix, Report
from nan_hunter.fixes.function_region import build_function_region_patch
from nan_hunter.fixes.python_numbers import python_numbers

# --- which names hold Python numbers -----------------------------------------------------------


def test_python_numbers_from_assignments_in_scope() -> None:
    source = textwrap.dedent(
        """\
        N = 8
        EPS = 1e-8
        GRID = torch.ones(3)


        class A:
            def __init__(self):
                self.scale = 30.0
                self.temp = -(2 ** 0.5)
                self.mixed = None
                self.mixed = 3
                self.weight = torch.ones(3)

            def forward(self, x, n):
                bsz = x.size(0)
                d = x.shape[-1]
                size = x.size()
                k = len(x) * 2
                m = max(bsz, d)
                return x * self.scale / bsz
        """
    )
    assert python_numbers(ast.parse(source), 20) == {
        "N", "EPS", "self.scale", "self.temp", "bsz", "d", "k", "m",
    }


def test_a_parameter_is_never_taken_for_a_number_of_another_scope() -> None:
    source = "n = 3\n\n\ndef f(n, x):\n    return x * n\n"
    assert python_numbers(ast.parse(source), 5) == set()


# --- casts on tensors only: generated shapes ---------------------------------------------------

NUMBER_SOURCES = {
    "float-attribute": ("self.gain = {value}", "self.gain"),
    "module-constant": (None, "GAIN"),
    "int-from-size": (None, "(x.size(0) * 0 + {value})"),
}


def _model(number: str, side: str, op: str, value: float, helper: bool) -> str:
    """A block whose linear output times (or over) a Python number leaves FP16's range."""
    init, name = NUMBER_SOURCES[number]
    lines = ["import torch", "from torch import nn", "", f"GAIN = {value}", "", ""]
    lines += [
        "class Block(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.fc = nn.Linear(16, 16)",
    ]
    if init:
        lines.append("        " + init.format(value=value))
    lines += ["", "    def forward(self, x):"]
    if number == "int-from-size":
        lines.append(f"        n = x.size(0) * 0 + {int(value)}")
        name = "n"
    operand = "self.fc(x)"
    if helper:
        lines.append("        h = self.fc(x)")
        operand = "h"
    expr = f"{operand} {op} {name}" if side == "left" else f"{name} {op} {operand}"
    if op == "/":  # a tiny number: the quotient overflows
        expr = f"{operand} / (1 / {name})" if side == "left" else f"(1 / {name}) ** -1 * {operand}"
    lines += [f"        y = {expr}", f"        return y / {name}", "", ""]
    lines += [
        "class Net(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.block = Block()",
        "        self.out = nn.Linear(16, 2)",
        "",
        "    def forward(self, x):",
        "        return self.out(self.block(x))",
        "",
        "",
        "def build_model():",
        "    torch.manual_seed(0)",
        "    return Net()",
        "",
        "",
        "def sample_batch():",
        "    torch.manual_seed(1)",
        "    return torch.randn(4, 16) * 8",
        "",
    ]
    return "\n".join(lines)


SHAPES = [
    (number, side, op, value, helper)
    for (number, side, op), value, helper in itertools.product(
        itertools.product(NUMBER_SOURCES, ("left", "right"), ("*", "/")), (1e4, 3e4), (False, True)
    )
]
"""24 x 2 models: the number's origin, its side, the operator, its size, a named operand."""


def _error(report: Report) -> Finding:
    errors = [f for f in report.findings if f.is_error]
    assert errors, "the generated model must fail the scan"
    return errors[0]


def _chosen(fix: Fix) -> Fix | None:
    return next((f for f in (fix, *fix.alternatives) if f.verified), None)


@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(map(str, s)) for s in SHAPES])
def test_no_cast_lands_on_a_python_number(shape: tuple, tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(_model(*shape), encoding="utf-8")
    finding = _error(scan_file(str(path)))
    assert finding.fix is not None
    for fix in (finding.fix, *finding.fix.alternatives):
        assert fix.diff is not None
        added = [line for line in fix.diff.splitlines() if line.startswith("+ ")]
        assert not any(f"{n}.float()" in line for line in added for n in ("gain", "GAIN", "n)")), (
            fix.diff
        )
    assert "AttributeError" not in " ".join(finding.fix.remaining)
    assert _chosen(finding.fix) is not None, finding.fix


# --- the whole function in FP32 ----------------------------------------------------------------


def _function_patch(tmp_path: Path, source: str, line_of: str) -> str | None:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if line_of in text)
    patch = build_function_region_patch(path, line, relative_to=tmp_path)
    return None if patch is None else patch.new_source


CAST = "{0} = {0}.float() if isinstance({0}, torch.Tensor) and {0}.dtype == torch.float16 else {0}"


def test_function_region_casts_the_tensor_parameters_inside_a_disabled_block(
    tmp_path: Path,
) -> None:
    source = '''\
        import torch


        class A(torch.nn.Module):
            @some_decorator
            def forward(self, q, k: torch.Tensor, n: int, *rest, mask=None, **options):
                """Docstring stays first."""
                s = q @ k.t()  # culprit
                text = """
        not re-indented
        """
                return s
        '''
    expected = f'''\
        import torch


        class A(torch.nn.Module):
            @some_decorator
            def forward(self, q, k: torch.Tensor, n: int, *rest, mask=None, **options):
                """Docstring stays first."""
                with torch.autocast(device_type="cuda", enabled=False):
                    {CAST.format("q")}
                    {CAST.format("k")}
                    {CAST.format("mask")}
                    s = q @ k.t()  # culprit
                    text = """
        not re-indented
        """
                    return s
        '''
    assert _function_patch(tmp_path, source, "culprit") == textwrap.dedent(expected)


def test_function_region_of_a_plain_function_adds_the_torch_import(tmp_path: Path) -> None:
    source = """\
        from torch import nn


        def attend(x):
            return x @ x.transpose(-2, -1)  # culprit
        """
    patched = _function_patch(tmp_path, source, "culprit")
    assert patched is not None
    assert patched.startswith("from torch import nn\nimport torch\n")
    assert f"        {CAST.format('x')}\n" in patched


@pytest.mark.parametrize(
    "source",
    [
        "x = 1  # culprit\n",  # at module level: no function
        "def f(x): return x @ x  # culprit\n",  # one line: nowhere to put the casts
        "import torch\n\n\ndef f(x):\n    with torch.autocast('cuda', enabled=False):\n"
        "        return x @ x  # culprit\n",  # already in FP32
        "def f(xs):\n    return [g(x) for x in xs] or (lambda y: y @ y)(xs)  # culprit\n",
    ],
    ids=["module-level", "one-line-def", "already-fp32", "lambda"],
)
def test_function_region_is_not_made_where_it_cannot_be(source: str, tmp_path: Path) -> None:
    assert _function_patch(tmp_path, source, "culprit") is None


COMPREHENSION = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            h = self.proj(x)
            return torch.stack(
                [(p @ p.transpose(-2, -1)).softmax(-1) @ p for p in h.chunk(2, dim=-1)]
            ).sum(0)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = Heads()
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            return self.out(self.heads(x))


    def build_model():
        torch.manual_seed(0)
        net = Net()
        nn.init.constant_(net.heads.proj.weight, 0.5)
        return net


    def sample_batch():
        torch.manual_seed(1)
        return torch.rand(2, 6, 16) * 4 + 20
    """
)


def test_an_op_in_a_comprehension_gets_its_function_in_fp32_verified(tmp_path: Path) -> None:
    """No statement region can be made inside a comprehension: the search goes straight to the
    function holding it, and the re-scan verifies it."""
    path = tmp_path / "model.py"
    path.write_text(COMPREHENSION, encoding="utf-8")
    finding = _error(scan_file(str(path)))
    assert (finding.op, finding.module) == ("Tensor.__matmul__", "heads")
    assert finding.fix is not None
    assert finding.fix.title.startswith("Run the function holding Tensor.__matmul__ (in heads)")
    assert finding.fix.verified is True, finding.fix.remaining
    assert '        with torch.autocast(device_type="cuda", enabled=False):' in (
        finding.fix.diff or ""
    )


def test_the_root_forward_is_not_offered_as_a_function_region(tmp_path: Path) -> None:
    """The root module's forward is the whole model: FP32 everywhere is no fix."""
    source = COMPREHENSION.replace(
        "        return self.out(self.heads(x))",
        "        h = self.heads.proj(x)\n"
        "        heads = [(p @ p.transpose(-2, -1)).softmax(-1) @ p for p in h.chunk(2, dim=-1)]\n"
        "        return self.out(torch.stack(heads).sum(0))",
    )
    path = tmp_path / "model.py"
    path.write_text(source, encoding="utf-8")
    finding = _error(scan_file(str(path)))
    assert (finding.op, finding.module) == ("Tensor.__matmul__", "")
    assert finding.fix is not None
    titles = [f.title for f in (finding.fix, *finding.fix.alternatives)]
    assert not any(t.startswith("Run the function holding") for t in titles), titles


# --- casts on the leaves of a sub-expression ---------------------------------------------------

LEAVES = [
    # (statement, culprit op, tensor operands, autocast-mode cast, half-mode cast)
    ("y = x / torch.sqrt(s + eps)", "Tensor.__truediv__", 2,
     "y = x.float() / torch.sqrt(s.float() + eps)", None),
    ("y = (k.transpose(-2, -1) @ v) * x", "Tensor.__mul__", 2,
     "y = (k.transpose(-2, -1).float() @ v.float()) * x.float()", None),
    ("y = self.proj(x) @ w", "Tensor.__matmul__", 2,
     "y = self.proj(x.float()) @ w.float()", "y = self.proj(x).float() @ w.float()"),
    ("y = -(x * x).sum(-1) / n", "Tensor.__truediv__", 1,
     "y = -(x.float() * x.float()).sum(-1) / n", None),
    ("y = torch.matmul(a + b, w) * x", "Tensor.__mul__", 2,
     "y = torch.matmul(a.float() + b.float(), w.float()) * x.float()", None),
    ("y = x.half() * w", "Tensor.__mul__", 2, "y = x.half().float() * w.float()", None),
]


def _leaf_source(statement: str) -> str:
    return textwrap.dedent(
        f"""\
        import torch


        class Block(torch.nn.Module):
            def forward(self, x, s, k, v, w, a, b, eps=1e-5):
                n = x.size(-1)
                {statement}
                return y
        """
    )


@pytest.mark.parametrize("half", [False, True], ids=["autocast", "half"])
@pytest.mark.parametrize("case", LEAVES, ids=[c[0] for c in LEAVES])
def test_casts_go_on_the_leaves_of_a_sub_expression(
    case: tuple[str, str, int, str, str | None], half: bool, tmp_path: Path
) -> None:
    """A cast on ``(s + eps)`` would leave the addition in FP16: the leaves are cast instead,
    a module call gets FP32 inputs under autocast (its weights are FP32) and is upcast after
    under ``model.half()`` (its weights are FP16); a Python number (``n``, ``eps``) never."""
    from nan_hunter.fixes.autocast_region import build_autocast_region_patch

    statement, op, n, autocast_cast, half_cast = case
    path = tmp_path / "m.py"
    path.write_text(_leaf_source(statement), encoding="utf-8")
    patch = build_autocast_region_patch(
        path, 7, op, n, relative_to=tmp_path, cast_back="torch.float16" if half else None
    )
    assert patch is not None
    expected = (half_cast or autocast_cast) if half else autocast_cast
    assert f"    {expected}\n" in patch.new_source, patch.new_source


# --- real bugs: advice that fits the op --------------------------------------------------------

ALL_IGNORED = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F
    from torch import nn


    def build_model():
        torch.manual_seed(0)
        return nn.Linear(8, 5)


    def sample_batch():
        return torch.randn(4, 8)


    def loss_fn(output, batch):
        target = torch.full((4,), {ignore})
        return F.{loss}({args}, target{kwargs})
    """
)


@pytest.mark.parametrize(
    ("loss", "args", "ignore", "kwargs"),
    [
        ("cross_entropy", "output", -100, ""),
        ("cross_entropy", "output", 0, ", ignore_index=0"),
        ("nll_loss", "output.log_softmax(-1)", -100, ""),
    ],
)
def test_a_batch_of_only_ignored_targets_gets_the_empty_mean_advice(
    loss: str, args: str, ignore: int, kwargs: str, tmp_path: Path
) -> None:
    path = tmp_path / "model.py"
    path.write_text(ALL_IGNORED.format(loss=loss, args=args, ignore=ignore, kwargs=kwargs))
    finding = _error(scan_file(str(path)))
    assert (finding.code, finding.op) == ("NH301", f"torch.nn.functional.{loss}")
    assert finding.fix is not None
    assert "every target is ignore_index" in finding.fix.title
    assert "reduction='sum'" in finding.fix.title


# --- a backward that overflows unscaled: the op in FP32 ----------------------------------------

STEEP = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            nn.init.zeros_(self.fc.weight)
            nn.init.constant_(self.fc.bias, 0.01)

        def forward(self, x):
            h = self.fc(x)
            return h.pow({k})


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return {call}


    def build_model():
        return Net()


    def sample_batch():
        return torch.ones(2, 4)


    def loss_fn(output, batch):
        return output.sum() * {weight}
    """
)


@pytest.mark.parametrize(
    ("k", "weight", "call"),
    [
        (-3, 3e-4, "self.block(x)"),
        (-2, 0.05, "self.block(x)"),
        (-3, 3e-4, "self.block(x) + 0"),
        (-2, 0.05, "self.block(x).relu()"),
    ],
)
def test_a_gradient_that_overflows_unscaled_gets_its_op_in_fp32_verified(
    k: int, weight: float, call: str, tmp_path: Path
) -> None:
    """The FP32 gradient of ``h.pow(k)`` near 0 fits FP32, not FP16, at every loss scale: no
    GradScaler setting helps; the op producing ``h`` computed in FP32 does, verified."""
    path = tmp_path / "model.py"
    path.write_text(STEEP.format(k=k, weight=weight, call=call), encoding="utf-8")
    finding = _error(scan_file(str(path)))
    assert finding.code == "NH401"
    assert finding.fix is not None
    assert finding.fix.title.startswith("Compute torch.nn.functional.linear in FP32")
    assert finding.fix.verified is True, finding.fix.remaining


# --- half mode: the cast back where the values are back in range ------------------------------

RETURNED = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.weight = nn.Parameter(torch.ones(16))

        def forward(self, x):
            h = self.proj(x) * 40.0
            {body}


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.out = nn.Linear(16, 2)

        def forward(self, x):
            return self.out(self.block(x))


    def build_model():
        torch.manual_seed(0)
        return Net()


    def sample_batch():
        torch.manual_seed(0)
        return torch.randn(4, 16) * 30
    """
)
RETURN_BODIES = {
    "rms-norm": "ms = (h * h).mean(-1, keepdim=True)\n"
    "        return h * torch.rsqrt(ms + 1e-6) * self.weight",
    "attention": "s = h @ h.transpose(-2, -1)\n"
    "        return s.softmax(-1) @ torch.tanh(h)",
    "softmax-by-hand": "e = torch.exp(h / 100)\n"
    "        return e / e.sum(-1, keepdim=True)",
}


@pytest.mark.parametrize("body", RETURN_BODIES, ids=list(RETURN_BODIES))
def test_half_mode_region_ending_in_return_casts_the_returned_value_back(
    body: str, tmp_path: Path
) -> None:
    """Under model.half() the parent's next Linear has FP16 weights: the FP32 value a region
    returns must be cast back, at the return, once the return brings it back in range, to the
    dtype the model runs in."""
    from nan_hunter.project.config import load_settings

    path = tmp_path / "model.py"
    path.write_text(RETURNED.format(body=RETURN_BODIES[body]), encoding="utf-8")
    finding = _error(scan_file(str(path), load_settings(overrides={"mode": "half"})))
    assert finding.fix is not None
    chosen = _chosen(finding.fix)
    assert chosen is not None, finding.fix
    # cast back to the dtype of an input the region upcast: FP16 under model.half(), FP32 in
    # an FP32 run of the same code (a hard-coded torch.float16 breaks that run's next Linear)
    assert ".to(h.dtype)" in (chosen.diff or ""), chosen.diff


# --- the finfo bound: named constants, parenthesised receivers --------------------------------

FINFO_SHAPES = {
    "attribute set in __init__": (
        "self.neg = -1e9",
        "s = s.masked_fill(m, self.neg)",
        "s = s.masked_fill(m, torch.finfo(s.dtype).min)",
    ),
    "local name": (
        "pass",
        "neg = -1e9\n        s = s.masked_fill(m, neg)",
        "s = s.masked_fill(m, torch.finfo(s.dtype).min)",
    ),
    "binary receiver": (
        "pass",
        "s = (q @ k / 4) + -1e9",
        "s = (masked := q @ k / 4) + torch.finfo(masked.dtype).min",
    ),
    "constant before a computed operand": (
        "pass",
        "s = -1e9 + (q @ k)",
        "s = torch.finfo((q @ k).dtype).min + (q @ k)",
    ),
}


@pytest.mark.parametrize("shape", FINFO_SHAPES, ids=list(FINFO_SHAPES))
def test_finfo_bound_replaces_the_constant_wherever_it_is_named(
    shape: str, tmp_path: Path
) -> None:
    from nan_hunter.fixes.rewrites import finfo_limit

    init, body, expected = FINFO_SHAPES[shape]
    text = (
        "import torch\n\n\nclass M(torch.nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        {init}\n\n"
        f"    def forward(self, s, m, q, k):\n        {body}\n        return s\n"
    )
    path = tmp_path / "m.py"
    path.write_text(text, encoding="utf-8")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip().startswith("s = "))
    patched = finfo_limit(path, line, -1e9)
    assert patched is not None
    assert expected in patched, patched
    ast.parse(patched)


FINFO_RECEIVERS = {
    "name": "s",
    "attribute": "self.s",
    "index": "s[:, :4]",
    "matmul": "q @ k.t()",
    "scaled matmul": "q @ k.t() / 2.0",
    "method chain": "s.float().half()",
    "dropout": "F.dropout(s, 0.5, training=True)",
}
FINFO_FORMS = {
    "method": "({t}).masked_fill(m, {c})",
    "torch function": "torch.masked_fill({t}, m, {c})",
    "keyword": "({t}).masked_fill(mask=m, value={c})",
    "additive": "({t}) + {c}",
}


@pytest.mark.parametrize("form", FINFO_FORMS, ids=list(FINFO_FORMS))
@pytest.mark.parametrize("receiver", FINFO_RECEIVERS, ids=list(FINFO_RECEIVERS))
def test_finfo_bound_computes_the_tensor_once_and_fills_its_limit(
    receiver: str, form: str, tmp_path: Path
) -> None:
    """Each receiver shape in each call shape: the patched line is computed from the same
    values as the original (the same RNG draws: a dropout is not run twice), a computed
    receiver appears once in it, and the fill is FP16's limit, not -inf."""
    import torch

    from nan_hunter.fixes.rewrites import finfo_limit

    tensor = FINFO_RECEIVERS[receiver]
    line = FINFO_FORMS[form].format(t=tensor, c="-1e9")
    text = (
        "import torch\nimport torch.nn.functional as F\n\n\nclass M(torch.nn.Module):\n"
        "    def forward(self, s, m, q, k):\n        self.s = s\n"
        f"        out = {line}\n        return out\n"
    )
    path = tmp_path / "m.py"
    path.write_text(text, encoding="utf-8")
    patched = finfo_limit(path, 8, -1e9)
    assert patched is not None, line
    new_line = patched.splitlines()[7]
    assert "-1e9" not in new_line and "torch.finfo(" in new_line, new_line
    if receiver not in ("name", "attribute", "index"):
        assert new_line.count(tensor) == 1, new_line

    def run(source: str) -> tuple[torch.Tensor, torch.Tensor]:
        scope: dict[str, object] = {}
        exec(compile(source, str(path), "exec"), scope)
        torch.manual_seed(0)
        s, q, k = (torch.randn(4, 4).half() for _ in range(3))
        m = torch.rand(4, 4) > 0.5
        out = scope["M"]().forward(s, m, q, k)  # type: ignore[operator]
        return out, torch.random.get_rng_state()

    patched_out, patched_rng = run(patched)
    # no extra random draws (the original, with a constant FP16 can hold, runs as written)
    assert torch.equal(patched_rng, run(text.replace("-1e9", "-1e4"))[1])
    assert patched_out.dtype == torch.float16 and bool(torch.isfinite(patched_out).all())
    # masked entries (and, added, every entry) at FP16's lowest value, not past it
    assert float(patched_out.min()) == float(torch.finfo(torch.float16).min)


def test_finfo_bound_leaves_a_name_assigned_two_different_values(tmp_path: Path) -> None:
    from nan_hunter.fixes.rewrites import finfo_limit

    text = (
        "import torch\n\n\ndef f(s, m, big):\n"
        "    neg = -1e9\n    if big:\n        neg = -1.0\n"
        "    return s.masked_fill(m, neg)\n"
    )
    path = tmp_path / "m.py"
    path.write_text(text, encoding="utf-8")
    assert finfo_limit(path, 8, -1e9) is None


def test_a_bool_mask_read_by_the_region_is_not_cast(tmp_path: Path) -> None:
    """masked_fill's mask is a bool tensor in the trace: ``.float()`` on it would make the
    patched forward fail ("masked_fill_ only supports boolean masks")."""
    from nan_hunter.project.config import load_settings

    path = tmp_path / "model.py"
    path.write_text(
        textwrap.dedent(
            """\
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 16)

                    self.register_buffer("neg", torch.tensor(-1e9))

                def forward(self, x):
                    s = self.fc(x)
                    mask = s < 0
                    s = s.masked_fill(mask, self.neg)
                    return s.softmax(-1)


            def build_model():
                torch.manual_seed(0)
                return Net()


            def sample_batch():
                torch.manual_seed(0)
                return torch.randn(4, 16)
            """
        ),
        encoding="utf-8",
    )
    finding = _error(scan_file(str(path), load_settings()))
    assert finding.fix is not None
    chosen = _chosen(finding.fix)
    assert chosen is not None, finding.fix
    assert "s.float()" in (chosen.diff or ""), chosen.diff
    assert "mask.float()" not in (chosen.diff or ""), chosen.diff
    assert chosen.verified is True, chosen.remaining


# --- a region whose result is still beyond FP16's range ---------------------------------------

BEYOND = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Head(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.lin = nn.Linear(d, d)
            with torch.no_grad():
                self.lin.weight.mul_(0.05)
                self.lin.bias.fill_(12.5)
            self.mix = nn.Linear(d, d)
            self.more = nn.Linear(d, d)
            self.w = nn.Parameter(torch.randn(d, d) * 0.3)

        def forward(self, x):
            e = torch.exp(self.lin(x))
            {tail}


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = Head(12)
            self.head = nn.Linear(12, 2)

        def forward(self, x):
            h = self.mixer(x)
            return self.head(h)


    def build_model():
        torch.manual_seed(0)
        return Net()


    def sample_batch():
        torch.manual_seed(0)
        return torch.randn(4, 12)
    """
)
BEYOND_TAILS = {
    "the caller's Linear": "return self.mix(e)",
    "the next statement's Linear": "y = self.mix(e)\n        return self.more(y) / 1e3",
    "the next statement's matmul": "y = self.mix(e)\n        return (y @ self.w) / 1e3",
}


@pytest.mark.parametrize("tail", BEYOND_TAILS, ids=list(BEYOND_TAILS))
def test_ops_taking_a_region_result_beyond_fp16_run_in_fp32_too(
    tail: str, tmp_path: Path
) -> None:
    """The Linear on exp's FP32 output (up to 2.7e5) is blamed, and FP32 for it alone does not
    verify: its result is as large, and the op taking it, which autocast runs in FP16,
    overflows in its place. The search's next step puts that op in FP32 as well, verified, and
    it is the finding's fix (the refuted narrow region is not shown)."""
    path = tmp_path / "model.py"
    path.write_text(BEYOND.format(tail=BEYOND_TAILS[tail]), encoding="utf-8")
    finding = _error(scan_file(str(path)))
    assert finding.op == "torch.nn.functional.linear"
    assert finding.fix is not None
    chosen = _chosen(finding.fix)
    assert chosen is finding.fix, [(f.title, f.remaining) for f in finding.fix.alternatives]
    assert "so the float16 ops taking it" in chosen.title
    assert (chosen.diff or "").count("with torch.autocast(") == 2, chosen.diff


def test_the_op_taking_it_in_another_file_of_the_project_runs_in_fp32_too(
    tmp_path: Path,
) -> None:
    """The culprit's module lives in the user's package, the Linear taking its result in the
    model file: one fix edits both files, verified, and its diff names both."""
    source = BEYOND.format(tail=BEYOND_TAILS["the caller's Linear"])
    head_end = source.index("class Net")
    (tmp_path / "blocks").mkdir()
    (tmp_path / "blocks" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "blocks" / "layers.py").write_text(source[:head_end], encoding="utf-8")
    path = tmp_path / "model.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\nfrom blocks.layers import Head\n\n\n"
        + source[head_end:],
        encoding="utf-8",
    )
    finding = _error(scan_file(str(path)))
    assert finding.location is not None and finding.location.file.endswith("layers.py")
    assert finding.fix is not None
    chosen = _chosen(finding.fix)
    assert chosen is not None, [(f.title, f.remaining) for f in finding.fix.alternatives]
    assert chosen.title.endswith("so the float16 ops taking it (model.py:15) run in FP32 too")
    diff = chosen.diff or ""
    assert "+++ b/blocks/layers.py" in diff and "+++ b/model.py" in diff
    assert "+            return self.head(h.float())" in diff
