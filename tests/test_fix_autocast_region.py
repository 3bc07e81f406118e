"""Tests for ``nan_hunter.fixes.autocast_region``: patched text, and diffs that really apply."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import textwrap

import pytest

from nan_hunter.fixes.autocast_region import RegionPatch, build_autocast_region_patch

HAS_PATCH = shutil.which("patch") is not None


def _write(tmp_path: pathlib.Path, rel: str, source: str) -> pathlib.Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source.encode("utf-8"))
    return path


def _line_of(source: str, needle: str) -> int:
    """1-based number of the only line containing ``needle``."""
    hits = [i for i, line in enumerate(source.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _run(args: list[str], cwd: pathlib.Path, diff: str) -> None:
    result = subprocess.run(
        args, cwd=cwd, input=diff.encode("utf-8"), capture_output=True, check=False
    )
    assert result.returncode == 0, (args, result.stdout.decode(), result.stderr.decode(), diff)


def _assert_applies(tmp_path: pathlib.Path, path: pathlib.Path, patch: RegionPatch) -> None:
    """``git apply --check`` and ``patch -p1 --dry-run`` accept the diff; applying it for real
    yields exactly ``new_source``."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, capture_output=True)
    _run(["git", "apply", "--check", "-"], tmp_path, patch.diff)
    if HAS_PATCH:
        _run(["patch", "-p1", "--dry-run", "--batch"], tmp_path, patch.diff)
    original = path.read_bytes()
    _run(["git", "apply", "-"], tmp_path, patch.diff)
    assert path.read_bytes() == patch.new_source.encode("utf-8")
    path.write_bytes(original)


def _patch(
    tmp_path: pathlib.Path,
    source: str,
    expected: str,
    culprit: str,
    op_name: str,
    n_tensor_operands: int,
    producers: tuple[str, ...] = (),
    rel: str = "model.py",
    **kwargs: object,
) -> RegionPatch:
    """Write ``source``, patch it at the line containing ``culprit``, check everything."""
    path = _write(tmp_path, rel, source)
    patch = build_autocast_region_patch(
        path,
        _line_of(source, culprit),
        op_name,
        n_tensor_operands,
        producer_lines=[_line_of(source, p) for p in producers],
        **kwargs,  # type: ignore[arg-type]
    )
    assert patch is not None
    assert patch.new_source == expected
    compile(patch.new_source, str(path), "exec")
    assert patch.diff.endswith("\n")
    assert all(line.endswith("\n") for line in patch.diff.splitlines(keepends=True))
    _assert_applies(tmp_path, path, patch)
    return patch


def _no_patch(
    tmp_path: pathlib.Path, source: str, culprit: str, op_name: str, n: int = 2
) -> RegionPatch | None:
    path = _write(tmp_path, "model.py", source)
    return build_autocast_region_patch(path, _line_of(source, culprit), op_name, n)


# --- the cases from the brief ------------------------------------------------------------------

ENCODER = """\
import torch
from torch import nn

class Encoder(nn.Module):
    def forward(self, z):
        dtd = self.D.T @ self.D
        dtd_inv = torch.inverse(dtd + self.lam * torch.eye(dtd.shape[0]))  # FP32 on purpose
        codes = torch.matmul(dtd_inv, z)
        return codes
"""

ENCODER_PATCHED = """\
import torch
from torch import nn

class Encoder(nn.Module):
    def forward(self, z):
        dtd = self.D.T @ self.D
        with torch.autocast(device_type="cuda", enabled=False):
            dtd_inv = torch.inverse(dtd + self.lam * torch.eye(dtd.shape[0]))  # FP32 on purpose
            codes = torch.matmul(dtd_inv.float(), z.float())
        return codes
"""


def test_matrix_inverse_producer_and_culprit_wrapped(tmp_path: pathlib.Path) -> None:
    patch = _patch(
        tmp_path,
        ENCODER,
        ENCODER_PATCHED,
        culprit="torch.matmul",
        op_name="torch.matmul",
        n_tensor_operands=2,
        producers=("torch.inverse",),
    )
    assert (patch.first_line, patch.last_line) == (7, 8)
    assert patch.diff.startswith("--- a/model.py\n+++ b/model.py\n@@ ")
    assert "-        codes = torch.matmul(dtd_inv, z)\n" in patch.diff
    assert "+            codes = torch.matmul(dtd_inv.float(), z.float())\n" in patch.diff


def test_culprit_alone_without_producers(tmp_path: pathlib.Path) -> None:
    expected = ENCODER.replace(
        "        codes = torch.matmul(dtd_inv, z)\n",
        '        with torch.autocast(device_type="cuda", enabled=False):\n'
        "            codes = torch.matmul(dtd_inv.float(), z.float())\n",
    )
    patch = _patch(tmp_path, ENCODER, expected, "torch.matmul", "torch.matmul", 2)
    assert (patch.first_line, patch.last_line) == (8, 8)


def test_matmul_operator(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def attention(q, k, v):
            scores = q @ k.transpose(-2, -1)
            return scores.softmax(-1) @ v
    """)
    expected = textwrap.dedent("""\
        import torch

        def attention(q, k, v):
            with torch.autocast(device_type="cuda", enabled=False):
                scores = q.float() @ k.transpose(-2, -1).float()
            return scores.softmax(-1) @ v
    """)
    _patch(tmp_path, source, expected, "scores = q @", "Tensor.__matmul__", 2)


def test_method_call_upcasts_receiver(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def probs(x):
            p = x.softmax(-1)
            return p
    """)
    expected = textwrap.dedent("""\
        import torch

        def probs(x):
            with torch.autocast(device_type="cuda", enabled=False):
                p = x.float().softmax(-1)
            return p
    """)
    _patch(tmp_path, source, expected, "softmax", "Tensor.softmax", 1)


def test_op_inside_module_call_falls_back_to_module_call(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch
        from torch import nn

        class Head(nn.Module):
            def forward(self, h):
                h = torch.relu(h)
                y = self.fc(h)
                return y
    """)
    expected = textwrap.dedent("""\
        import torch
        from torch import nn

        class Head(nn.Module):
            def forward(self, h):
                h = torch.relu(h)
                with torch.autocast(device_type="cuda", enabled=False):
                    y = self.fc(h.float())
                return y
    """)
    _patch(tmp_path, source, expected, "self.fc(h)", "torch.nn.functional.linear", 3)


def test_fallback_skips_torch_calls_for_outermost_user_call(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def f(self, h):
            y = torch.tanh(self.fc(h + 1))
            return y
    """)
    expected = textwrap.dedent("""\
        import torch

        def f(self, h):
            with torch.autocast(device_type="cuda", enabled=False):
                y = torch.tanh(self.fc(h.float() + 1))
            return y
    """)
    _patch(tmp_path, source, expected, "torch.tanh", "torch.nn.functional.linear", 1)


def test_multi_line_call(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F

        def project(x, w, b):
            out = F.linear(
                x, w, b  # weights stay FP32
            )
            return out
    """)
    expected = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F

        def project(x, w, b):
            with torch.autocast(device_type="cuda", enabled=False):
                out = F.linear(
                    x.float(), w.float(), b  # weights stay FP32
                )
            return out
    """)
    patch = _patch(tmp_path, source, expected, "F.linear(", "torch.nn.functional.linear", 2)
    assert (patch.first_line, patch.last_line) == (5, 7)


def test_producer_in_another_block_is_ignored(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def solve(a, z, refine):
            inv = torch.inverse(a)
            if refine:
                y = torch.matmul(inv, z)
                return y
            return z
    """)
    expected = textwrap.dedent("""\
        import torch

        def solve(a, z, refine):
            inv = torch.inverse(a)
            if refine:
                with torch.autocast(device_type="cuda", enabled=False):
                    y = torch.matmul(inv.float(), z.float())
                return y
            return z
    """)
    patch = _patch(
        tmp_path, source, expected, "torch.matmul", "torch.matmul", 2, producers=("inverse",)
    )
    assert (patch.first_line, patch.last_line) == (6, 6)


def test_producer_nested_in_a_preceding_compound_statement_is_ignored(
    tmp_path: pathlib.Path,
) -> None:
    source = textwrap.dedent("""\
        import torch

        def solve(a, z):
            for _ in range(2):
                a = torch.inverse(a)
            s = a.sum()
            y = torch.matmul(a, z)
            return y, s
    """)
    expected = textwrap.dedent("""\
        import torch

        def solve(a, z):
            for _ in range(2):
                a = torch.inverse(a)
            s = a.sum()
            with torch.autocast(device_type="cuda", enabled=False):
                y = torch.matmul(a.float(), z.float())
            return y, s
    """)
    _patch(tmp_path, source, expected, "torch.matmul", "torch.matmul", 2, producers=("inverse",))


def test_region_spans_intervening_statements_and_comments(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def solve(a, z):
            inv = torch.inverse(a)
            # scale before the product
            inv = inv * 2.0

            y = inv @ z
            return y
    """)
    expected = textwrap.dedent("""\
        import torch

        def solve(a, z):
            with torch.autocast(device_type="cuda", enabled=False):
                inv = torch.inverse(a)
                # scale before the product
                inv = inv * 2.0

                y = inv.float() @ z.float()
            return y
    """)
    patch = _patch(
        tmp_path, source, expected, "y = inv @ z", "Tensor.__matmul__", 2, producers=("inverse",)
    )
    assert (patch.first_line, patch.last_line) == (4, 8)


def test_culprit_in_if_condition_is_refused(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def check(a, b):
            if torch.matmul(a, b).sum() > 0:
                return a
            return b
    """)
    assert _no_patch(tmp_path, source, "torch.matmul", "torch.matmul") is None


def test_culprit_in_with_item_or_for_header_is_refused(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def loop(a, b, ctx):
            with ctx(a @ b):
                pass
            for row in torch.matmul(a, b):
                print(row)
    """)
    assert _no_patch(tmp_path, source, "ctx(a @ b)", "Tensor.__matmul__") is None
    assert _no_patch(tmp_path, source, "torch.matmul", "torch.matmul") is None


def test_syntax_error_file_is_refused(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\ndef f(a, b)\n    return torch.matmul(a, b)\n"
    assert _no_patch(tmp_path, source, "torch.matmul", "torch.matmul") is None


def test_lambda_and_comprehension_are_refused(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def build(w, xs):
            f = lambda x: torch.matmul(x, w)
            ys = [x @ w for x in xs]
            zs = self_module([x @ w for x in xs])
            return f, ys, zs
    """)
    assert _no_patch(tmp_path, source, "lambda", "torch.matmul") is None
    assert _no_patch(tmp_path, source, "ys = ", "Tensor.__matmul__") is None
    assert _no_patch(tmp_path, source, "zs = ", "Tensor.__matmul__") is None


def test_statements_sharing_the_line_are_refused(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        import torch

        def f(a, b):
            y = a @ b; z = y
            if a is None: w = a @ b
            return z
    """)
    assert _no_patch(tmp_path, source, "y = a @ b", "Tensor.__matmul__") is None
    assert _no_patch(tmp_path, source, "w = a @ b", "Tensor.__matmul__") is None


def test_no_matching_op_and_no_user_call_is_refused(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\ndef f(a, b):\n    return torch.add(a, b)\n"
    assert _no_patch(tmp_path, source, "torch.add", "torch.matmul") is None


def test_missing_import_torch_is_added_after_last_import(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        \"\"\"A model.\"\"\"
        from __future__ import annotations

        import math
        from torch import nn

        class M(nn.Module):
            def forward(self, x, w):
                return x @ w / math.sqrt(w.shape[0])
    """)
    expected = textwrap.dedent("""\
        \"\"\"A model.\"\"\"
        from __future__ import annotations

        import math
        from torch import nn
        import torch

        class M(nn.Module):
            def forward(self, x, w):
                with torch.autocast(device_type="cuda", enabled=False):
                    return x.float() @ w.float() / math.sqrt(w.shape[0])
    """)
    _patch(tmp_path, source, expected, "return x @ w", "Tensor.__matmul__", 2)


def test_missing_import_torch_goes_after_docstring_without_imports(
    tmp_path: pathlib.Path,
) -> None:
    source = textwrap.dedent("""\
        #!/usr/bin/env python
        \"\"\"Doc.\"\"\"

        def f(x, w):
            return x.matmul(w)
    """)
    expected = textwrap.dedent("""\
        #!/usr/bin/env python
        \"\"\"Doc.\"\"\"
        import torch

        def f(x, w):
            with torch.autocast(device_type="cuda", enabled=False):
                return x.float().matmul(w.float())
    """)
    _patch(tmp_path, source, expected, "matmul", "Tensor.matmul", 2)


def test_import_torch_alias_alone_does_not_count(tmp_path: pathlib.Path) -> None:
    source = "import torch as th\n\n\ndef f(x, w):\n    return th.mm(x, w)\n"
    expected = (
        "import torch as th\nimport torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        return th.mm(x.float(), w.float())\n"
    )
    _patch(tmp_path, source, expected, "th.mm", "torch.mm", 2)


def test_no_trailing_newline(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x, w):\n    y = x @ w\n    return y"
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        y = x.float() @ w.float()\n    return y"
    )
    _patch(tmp_path, source, expected, "y = x @ w", "Tensor.__matmul__", 2)


def test_no_trailing_newline_on_the_culprit_line(tmp_path: pathlib.Path) -> None:
    source = "from torch import nn\n\n\ndef f(x, w):\n    return x @ w"
    expected = (
        "from torch import nn\nimport torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        return x.float() @ w.float()"
    )
    patch = _patch(tmp_path, source, expected, "return x @ w", "Tensor.__matmul__", 2)
    assert "\\ No newline at end of file\n" in patch.diff


# --- operands ----------------------------------------------------------------------------------


def test_augmented_assignment_is_rewritten_out_of_place(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(self, w):\n    self.h *= w + 1  # grow\n    return self.h\n"
    expected = (
        "import torch\n\n\ndef f(self, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        self.h = self.h.float() * (w.float() + 1)  # grow\n    return self.h\n"
    )
    _patch(tmp_path, source, expected, "self.h *=", "Tensor.__imul__", 2)


def test_constants_and_existing_upcasts_are_left_alone(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x, w):\n    y = x.float() - -w\n    return 2.0 * y\n"
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        y = x.float() - -w.float()\n    return 2.0 * y\n"
    )
    _patch(tmp_path, source, expected, "y = x", "Tensor.__sub__", 2)
    expected = (
        "import torch\n\n\ndef f(x, w):\n    y = x.float() - -w\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        return 2.0 * y.float()\n"
    )
    _patch(tmp_path, source, expected, "return 2.0", "Tensor.__rmul__", 2)


def test_unknown_operand_count_upcasts_non_constant_positionals(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x):\n    return torch.softmax(x, -1, dtype=None)\n"
    expected = (
        "import torch\n\n\ndef f(x):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        return torch.softmax(x.float(), -1, dtype=None)\n"
    )
    _patch(tmp_path, source, expected, "softmax", "torch.softmax", 0)


def test_non_ascii_text_before_operands(tmp_path: pathlib.Path) -> None:
    source = 'import torch\n\n\ndef f(x, w):\n    return {"größe": torch.matmul(x, w)}  # ü\n'
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cpu", enabled=False):\n'
        '        return {"größe": torch.matmul(x.float(), w.float())}  # ü\n'
    )
    _patch(tmp_path, source, expected, "größe", "torch.matmul", 2, device_type="cpu")


# --- layout ------------------------------------------------------------------------------------


def test_multi_line_string_in_region_is_not_reindented(tmp_path: pathlib.Path) -> None:
    source = (
        "import torch\n\n\ndef f(x, w):\n"
        '    note = """line one\nline two"""\n'
        "    y = torch.mm(x, w)\n    return y, note\n"
    )
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        '        note = """line one\nline two"""\n'
        "        y = torch.mm(x.float(), w.float())\n    return y, note\n"
    )
    _patch(tmp_path, source, expected, "torch.mm", "torch.mm", 2, producers=("note =",))


def test_tab_indentation(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x, w):\n\ty = torch.mm(x, w)\n\treturn y\n"
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '\twith torch.autocast(device_type="cuda", enabled=False):\n'
        "\t\ty = torch.mm(x.float(), w.float())\n\treturn y\n"
    )
    _patch(tmp_path, source, expected, "torch.mm", "torch.mm", 2)


def test_crlf_line_endings_are_kept(tmp_path: pathlib.Path) -> None:
    source = "import torch\r\n\r\n\r\ndef f(x, w):\r\n    y = x @ w\r\n    return y\r\n"
    expected = (
        "import torch\r\n\r\n\r\ndef f(x, w):\r\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\r\n'
        "        y = x.float() @ w.float()\r\n    return y\r\n"
    )
    _patch(tmp_path, source, expected, "y = x @ w", "Tensor.__matmul__", 2)


def test_module_level_culprit_and_decorated_producer(tmp_path: pathlib.Path) -> None:
    source = textwrap.dedent("""\
        \"\"\"Script.\"\"\"
        import functools

        import torch

        a = torch.randn(4, 4)

        @functools.cache
        def inv():
            return torch.inverse(a)

        b = inv() @ a
    """)
    expected = textwrap.dedent("""\
        \"\"\"Script.\"\"\"
        import functools

        import torch

        a = torch.randn(4, 4)

        with torch.autocast(device_type="cuda", enabled=False):
            @functools.cache
            def inv():
                return torch.inverse(a)

            b = inv().float() @ a.float()
    """)
    patch = _patch(
        tmp_path, source, expected, "b = inv()", "Tensor.__matmul__", 2, producers=("def inv",)
    )
    assert (patch.first_line, patch.last_line) == (8, 12)


def test_import_torch_after_module_level_region_does_not_count(tmp_path: pathlib.Path) -> None:
    source = "import os\n\ny = os.environ @ 2\n\nimport torch\n"
    expected = (
        "import os\nimport torch\n\n"
        'with torch.autocast(device_type="cuda", enabled=False):\n'
        "    y = os.environ.float() @ 2\n\nimport torch\n"
    )
    _patch(tmp_path, source, expected, "y = os", "Tensor.__matmul__", 2)


def test_diff_paths_relative_to_given_folder(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x, w):\n    return torch.mm(x, w)\n"
    expected = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        return torch.mm(x.float(), w.float())\n"
    )
    patch = _patch(
        tmp_path,
        source,
        expected,
        "torch.mm",
        "torch.mm",
        2,
        rel="pkg/sub/model.py",
        relative_to=tmp_path,
    )
    assert patch.diff.startswith("--- a/pkg/sub/model.py\n+++ b/pkg/sub/model.py\n")


def test_default_diff_paths_are_relative_to_the_file_folder(tmp_path: pathlib.Path) -> None:
    source = "import torch\n\n\ndef f(x, w):\n    return torch.mm(x, w)\n"
    path = _write(tmp_path, "pkg/model.py", source)
    patch = build_autocast_region_patch(path, 5, "torch.mm", 2)
    assert patch is not None
    assert patch.diff.startswith("--- a/model.py\n+++ b/model.py\n")


def test_bad_device_type_is_rejected(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, "model.py", "import torch\n\n\ndef f(x):\n    return x.softmax(-1)\n")
    with pytest.raises(ValueError, match="device type"):
        build_autocast_region_patch(path, 5, "Tensor.softmax", 1, device_type='cuda"); x=("')


def test_upcast_sites_inside_the_region_are_upcast_too(tmp_path: pathlib.Path) -> None:
    """An eps addition upstream of the culprit gets ``.float()`` operands as well; its result,
    computed in FP32 inside the region, gets none (``.float()`` once per tensor, at entry)."""
    path = tmp_path / "norm.py"
    path.write_text(
        "import torch\n"
        "\n"
        "def forward(x, m):\n"
        "    denom = m + 1e-8\n"
        "    y = x / denom\n"
        "    return y\n"
    )
    patch = build_autocast_region_patch(
        path, 5, "Tensor.__truediv__", 2, producer_lines=[4], device_type="cuda",
        upcast_sites=[(4, "Tensor.__add__", 1), (99, "Tensor.__add__", 1)],
    )
    assert patch is not None
    assert patch.new_source == (
        "import torch\n"
        "\n"
        "def forward(x, m):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        denom = m.float() + 1e-8\n"
        "        y = x.float() / denom\n"
        "    return y\n"
    )


def test_a_culprit_already_in_an_fp32_region_is_not_wrapped_again(tmp_path: pathlib.Path) -> None:
    """A later --fix-all round never nests a region inside the one an earlier round made."""
    source = (
        "import torch\n\n\ndef f(x, w):\n"
        '    with torch.autocast(device_type="cuda", enabled=False):\n'
        "        y = x.float() @ w.float()\n    return y\n"
    )
    path = _write(tmp_path, "model.py", source)
    assert build_autocast_region_patch(path, 6, "Tensor.__matmul__", 2) is None


def test_a_region_can_name_the_device_of_a_tensor_entering_it(tmp_path: pathlib.Path) -> None:
    """``nan-hunter run``: the region switches off the autocast of the device the code runs on
    (the same line on a GPU and a CPU), named by the first tensor the region upcasts; a region
    with no such tensor names the device given."""
    source = textwrap.dedent("""\
        import torch

        def attention(q, k, v):
            scores = q @ k.transpose(-2, -1)
            return scores.softmax(-1) @ v
    """)
    path = _write(tmp_path, "attention.py", source)
    patch = build_autocast_region_patch(
        path, 4, "Tensor.__matmul__", 2, device_type="cpu", device_from_input=True
    )
    assert patch is not None
    assert patch.new_source == textwrap.dedent("""\
        import torch

        def attention(q, k, v):
            with torch.autocast(device_type=q.device.type, enabled=False):
                scores = q.float() @ k.transpose(-2, -1).float()
            return scores.softmax(-1) @ v
    """)
    fp32_operands = build_autocast_region_patch(
        path, 4, "Tensor.__matmul__", 2, device_type="cpu", device_from_input=True,
        uncast_operands=frozenset({0, 1}),
    )
    assert fp32_operands is not None
    assert '    with torch.autocast(device_type="cpu", enabled=False):\n' in (
        fp32_operands.new_source
    )
