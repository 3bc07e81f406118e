"""The README's promises that a reader copies: the GitHub Actions job, the pyproject settings and
the suppression comment it shows are checked here against the code; so are its size and every
relative link of the README and the pages under docs/."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from nan_hunter.project.config import load_settings
from nan_hunter.project.discovery import discover
from nan_hunter.project.suppressions import parse_comment
from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

README = (ROOT / "README.md").read_text(encoding="utf-8")
README_MAX_LINES = 300
"""The README is what a user reads; everything longer belongs in docs/."""
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
"""A Markdown link's target: ``[text](target)``, not an image."""


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def _workflow() -> dict:
    (block,) = [b for b in _blocks("yaml") if "jobs:" in b]
    return yaml.safe_load(block)


def test_actions_job_can_upload_sarif() -> None:
    workflow = _workflow()
    assert workflow["permissions"]["security-events"] == "write"
    assert workflow["permissions"]["contents"] == "read"


def test_actions_job_uses_current_action_majors() -> None:
    steps = _workflow()["jobs"]["nan-hunter"]["steps"]
    uses = sorted({step["uses"] for step in steps if "uses" in step})
    assert uses == [
        "actions/checkout@v5",
        "actions/setup-python@v6",
        "github/codeql-action/upload-sarif@v4",  # v3 is deprecated in December 2026
    ]


def test_actions_job_installs_the_project_and_nan_hunter_from_the_repository() -> None:
    steps = _workflow()["jobs"]["nan-hunter"]["steps"]
    installs = [step["run"] for step in steps if "pip install" in step.get("run", "")]
    assert installs == [
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        "pip install -e .",  # the user's project: the model file imports it
        "pip install ./.nan-hunter",
    ]
    checkout = [s for s in steps if s.get("with", {}).get("path") == ".nan-hunter"]
    assert len(checkout) == 1
    scans = [step["run"] for step in steps if step.get("run", "").startswith("nan-hunter scan")]
    assert any("--format github" in s for s in scans)
    assert any("--format sarif --output nan-hunter.sarif" in s for s in scans)
    upload = [s for s in steps if s.get("uses", "").startswith("github/codeql-action")]
    assert upload[0]["with"]["sarif_file"] == "nan-hunter.sarif"


def test_setup_is_two_commands() -> None:
    section = README.split("## Set up and run (fresh machine)")[1].split("\n## ")[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert len(block.strip().splitlines()) == 2


def test_pyproject_example_is_valid_configuration(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks("toml") if "[tool.nan-hunter]" in b]
    assert tomllib.loads(block)["tool"]["nan-hunter"]
    (tmp_path / "pyproject.toml").write_text(block, encoding="utf-8")
    settings = load_settings(project=discover(tmp_path))
    assert settings.fail_on == "warning" and settings.ignore == ("NH5",)
    assert settings.max_warnings == 10


def test_suppression_example_parses_with_a_reason() -> None:
    (line,) = [x for x in README.splitlines() if "# nan-hunter: ignore[" in x and "=" in x]
    directive = parse_comment(line[line.index("#"):], 1)
    assert directive is not None
    assert directive.codes == ("NH102",) and directive.reason


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        slug = _slug(heading)
        n = 0
        while (slug if n == 0 else f"{slug}-{n}") in anchors:
            n += 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short() -> None:
    lines = len(README.splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_relative_links_point_at_files_that_exist() -> None:
    """Every relative link of README.md and docs/*.md names a file or folder of the repository
    (``docs/guarantees.md``, ``../benchmarks/speed.py``); one into a Markdown page with
    ``#anchor`` names a heading of that page."""
    if not (ROOT / "docs").is_dir():
        pytest.skip("no docs/ folder (an sdist without the documentation)")
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            name = f"{page.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{name} (no such file)")
            elif ROOT not in resolved.parents and resolved != ROOT:
                broken.append(f"{name} (outside the repository)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{name} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)
