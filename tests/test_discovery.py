"""Project settings: ``[tool.nan-hunter]`` in pyproject.toml, nan-hunter.yaml, .nan-hunter.yaml;
their discovery, precedence (defaults < project file < --config < flags) and ``nan-hunter
config``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.errors import ConfigError
from nan_hunter.project.config import load_settings
from nan_hunter.project.discovery import discover, search_start
from tests.conftest import EXAMPLES

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def _project(
    tmp_path: Path, pyproject: str | None = None, files: dict[str, str] | None = None
) -> Path:
    """A project folder with a copy of matrix_inverse.py (NH101) in models/."""
    root = tmp_path / "proj"
    (root / "models").mkdir(parents=True)
    shutil.copy(EXAMPLES / "matrix_inverse.py", root / "models" / "model.py")
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    for name, text in (files or {}).items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_pyproject_table_is_found_from_a_subfolder(tmp_path: Path) -> None:
    root = _project(tmp_path, '[tool.nan-hunter]\nfail-on = "warning"\nignore = ["NH5"]\n')
    found = discover(search_start([str(root / "models" / "model.py")]))
    assert found is not None
    assert found.path == root / "pyproject.toml"
    assert dict(found.values) == {"fail_on": "warning", "ignore": ["NH5"]}
    settings = load_settings(project=found)
    assert settings.fail_on == "warning" and settings.ignore == ("NH5",)
    assert settings.sources["fail_on"] == f"{root / 'pyproject.toml'} [tool.nan-hunter]"
    assert settings.sources["dtype"] == "default"


def test_pyproject_without_the_table_is_passed_over(tmp_path: Path) -> None:
    root = _project(tmp_path, '[project]\nname = "x"\n')
    (tmp_path / "nan-hunter.yaml").write_text("max_warnings: 3\n", encoding="utf-8")
    found = discover(root / "models")
    assert found is not None and found.path == tmp_path / "nan-hunter.yaml"
    assert dict(found.values) == {"max_warnings": 3}


def test_nearest_folder_wins_and_yaml_before_pyproject(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "[tool.nan-hunter]\nmax_warnings = 1\n",
        {"nan-hunter.yaml": "max_warnings: 2\n", ".nan-hunter.yaml": "max_warnings: 3\n"},
    )
    assert discover(root).path == root / "nan-hunter.yaml"  # type: ignore[union-attr]
    (root / "nan-hunter.yaml").unlink()
    assert discover(root).path == root / ".nan-hunter.yaml"  # type: ignore[union-attr]
    (root / ".nan-hunter.yaml").unlink()
    assert discover(root).path == root / "pyproject.toml"  # type: ignore[union-attr]
    (root / "models" / "nan-hunter.yaml").write_text("max_warnings: 4\n", encoding="utf-8")
    assert discover(root / "models").path == root / "models" / "nan-hunter.yaml"  # type: ignore[union-attr]


def test_search_starts_at_the_common_folder_or_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.py").write_text("", encoding="utf-8")
    assert search_start([str(tmp_path / "a" / "m.py"), str(tmp_path / "b")]) == tmp_path.resolve()
    assert search_start([]) == Path.cwd().resolve()
    assert search_start(["pkg.module"]) == Path.cwd().resolve()


def test_precedence_defaults_project_config_flags(tmp_path: Path) -> None:
    """matrix_inverse has one NH101 error: ignoring NH1 makes it clean (exit 0)."""
    root = _project(tmp_path, '[tool.nan-hunter]\nignore = ["NH1"]\nverify-fixes = false\n')
    model = str(root / "models" / "model.py")
    assert invoke("scan", model, "--quiet")[0] == 0  # the project file applies
    config = tmp_path / "strict.yaml"
    config.write_text("ignore: []\n", encoding="utf-8")
    assert invoke("scan", model, "--config", str(config))[0] == 1  # --config over the project
    assert invoke("scan", model, "--config", str(config), "--ignore", "NH101")[0] == 0  # flags last


def test_config_command_shows_values_and_sources(tmp_path: Path) -> None:
    root = _project(tmp_path, '[tool.nan-hunter]\nfail-on = "warning"\n')
    config = tmp_path / "extra.yaml"
    config.write_text("max_warnings: 7\n", encoding="utf-8")
    code, out, err = invoke("config", str(root / "models"), "--config", str(config))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"# project settings: {root / 'pyproject.toml'} [tool.nan-hunter]"
    by_key = {line.split(":", 1)[0]: line for line in lines[1:]}
    assert by_key["fail_on"].split("#")[0].strip() == "fail_on: warning"
    assert by_key["fail_on"].endswith(f"# {root / 'pyproject.toml'} [tool.nan-hunter]")
    assert by_key["max_warnings"].endswith(f"# {config}")
    assert by_key["dtype"].endswith("# default (configs/default.yaml)")
    assert by_key["select"].split("#")[0].strip() == "select: [NH]"


def test_config_command_without_a_project_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = invoke("config")
    assert code == 0
    assert out.splitlines()[0] == "# project settings: none found"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tool.nan-hunter]\nfail-onn = "warning"\n', "unknown key 'fail_onn'"),
        ('[tool.nan-hunter]\ndtype = "float8"\n', "'dtype' must be one of"),
        ("[tool.nan-hunter\n", "is not valid TOML"),
        ('[tool]\nnan-hunter = "x"\n', "[tool.nan-hunter] must be a table"),
    ],
)
def test_bad_project_settings_are_a_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    root = _project(tmp_path, text)
    for args in (("scan", str(root / "models" / "model.py")), ("config", str(root))):
        code, out, err = invoke(*args)
        assert code == 2, (args, out, err)
        assert out == ""
        assert err.startswith("nan-hunter: error: ") and err.count("\n") == 1
        assert message in err
        assert str(root / "pyproject.toml") in err


def test_unknown_key_in_a_discovered_yaml(tmp_path: Path) -> None:
    root = _project(tmp_path, files={"nan-hunter.yaml": "colour: red\n"})
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_settings(project=discover(root))
