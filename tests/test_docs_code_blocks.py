"""Every code block in the README and docs/ is checked, or marked as illustrative.

A fenced block is checked by its language: ``python`` compiles and every name it takes from
``nan_hunter`` exists; ``toml``/``yaml`` parse, and a ``[tool.nan-hunter]`` table loads as
settings; every ``nan-hunter ...`` command line (in ``bash`` blocks, and in the README's indented
command examples) parses against the real command line, options included; the README's report
is the real report of ``examples/matrix_inverse.py`` (its lines, in order, timing aside). A block
that none of these can check (a diagram, a sample with ``...``) says so with an
``<!-- illustrative -->`` line right above its fence."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.project.config import load_settings
from nan_hunter.project.discovery import discover
from tests.conftest import EXAMPLES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ILLUSTRATIVE = "<!-- illustrative -->"
CHECKED = {"python", "toml", "yaml", "bash", "text"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    illustrative: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^(`{3,})(\w*)\s*$", lines[i])
            if fence is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
            marked = i > 0 and lines[i - 1].strip() == ILLUSTRATIVE
            found.append(Block(page, i + 1, fence.group(2), "\n".join(lines[i + 1 : end]), marked))
            i = end + 1
    return found


BLOCKS = _blocks()
COMMAND = get_command(app)


def _parses(line: str) -> None:
    """The command line ``line`` (``nan-hunter ...``) parses: its command and options exist and
    take the values given."""
    args = shlex.split(line, comments=True)[1:]
    ctx = COMMAND.make_context("nan-hunter", args)
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    name, sub, rest = COMMAND.resolve_command(ctx, rest)  # type: ignore[attr-defined]
    assert sub is not None, line
    sub.make_context(name, rest, parent=ctx)


def _commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("nan-hunter ")]


def _check_python(block: Block) -> None:
    tree = ast.parse(block.code)  # a SyntaxError fails the block
    compile(tree, block.name, "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nan_hunter"):
            try:
                module = importlib.import_module(node.module or "")
            except ModuleNotFoundError as exc:  # an integration's library, an optional extra
                if (exc.name or "").split(".")[0] == "nan_hunter":
                    raise
                pytest.skip(f"{block.name}: needs {exc.name} (pip install -e '.[frameworks]')")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.name}: no {node.module}.{alias.name}"
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "nan_hunter"
        ):
            import nan_hunter

            assert hasattr(nan_hunter, node.attr), f"{block.name}: no nan_hunter.{node.attr}"


def _check_config(block: Block, tmp_path: Path) -> None:
    if block.language == "toml":
        data = tomllib.loads(block.code)
        if "nan-hunter" in data.get("tool", {}):  # found and read as a project's own file
            (tmp_path / "pyproject.toml").write_text(block.code, encoding="utf-8")
            load_settings(project=discover(tmp_path))
    else:
        data = yaml.safe_load(block.code)
        assert isinstance(data, dict), block.name


def _check_report(block: Block) -> None:
    """The README's report: the real one, abridged only by dropping lines."""
    result = CliRunner().invoke(
        app, ["scan", str(EXAMPLES / "matrix_inverse.py")], env={"COLUMNS": "100"}
    )
    assert result.exit_code == 1, result.stderr

    def timeless(text: str) -> list[str]:
        return [re.sub(r" in \d+\.\d+s$", "", line) for line in text.splitlines()]

    real = iter(timeless(result.stdout.replace(str(ROOT) + "/", "")))
    for line in timeless(block.code):
        assert any(line == other for other in real), f"{block.name}: not in the report: {line!r}"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_every_code_block_is_checked_or_marked_illustrative(block: Block, tmp_path: Path) -> None:
    if block.illustrative:
        return
    assert block.language in CHECKED, (
        f"{block.name}: a ```{block.language} block nothing checks: check it here, or put "
        f"{ILLUSTRATIVE} on the line above its fence"
    )
    if block.language == "python":
        _check_python(block)
    elif block.language in ("toml", "yaml"):
        _check_config(block, tmp_path)
    elif block.language == "bash":
        for line in _commands(block.code):
            _parses(line)
    else:  # text
        assert block.page.name == "README.md" and block.code.startswith("nan-hunter examples/"), (
            f"{block.name}: a text block that is not the README's report: mark it illustrative"
        )
        _check_report(block)


SUBCOMMANDS = tuple(COMMAND.commands)  # type: ignore[attr-defined]
INDENTED = [
    line.strip()
    for page in PAGES
    for line in page.read_text(encoding="utf-8").splitlines()
    if re.match(rf"    nan-hunter ({'|'.join(SUBCOMMANDS)}|-)", line)
]
"""Indented command examples (``    nan-hunter run train.py ...``), not report lines."""


@pytest.mark.parametrize("line", INDENTED)
def test_every_indented_command_example_parses(line: str) -> None:
    _parses(line)


def test_a_misspelt_option_does_not_parse() -> None:
    with pytest.raises(Exception, match="--fix-al"):
        _parses("nan-hunter scan model.py --fix-al")
