"""Tests for ``nan_hunter.project.config``: defaults, config files, command-line overrides,
validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from nan_hunter.errors import ConfigError
from nan_hunter.project.config import DEFAULT_CONFIG, Settings, load_settings, read_config_file

ROOT = Path(__file__).resolve().parents[1]
REPO_DEFAULTS = ROOT / "configs" / "default.yaml"
KEYS = [f.name for f in dataclasses.fields(Settings) if f.name != "sources"]


def _as_setting(value: object) -> object:
    if value == "none":  # grad_scale: none
        return None
    return tuple(value) if isinstance(value, list) else value


def _config(tmp_path: Path, text: str, name: str = "nh.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults ---------------------------------------------------------------------------------


def test_defaults_equal_configs_default_yaml() -> None:
    data = yaml.safe_load(REPO_DEFAULTS.read_text(encoding="utf-8"))
    assert sorted(data) == sorted(KEYS)
    settings = load_settings()
    for key in KEYS:
        assert getattr(settings, key) == _as_setting(data[key]), key
    assert dict(settings.sources) == dict.fromkeys(KEYS, "default")


def test_packaged_defaults_match_repo_defaults() -> None:
    assert DEFAULT_CONFIG.read_text(encoding="utf-8") == REPO_DEFAULTS.read_text(encoding="utf-8")


def test_defaults_equal_dataclass_defaults() -> None:
    settings = load_settings()
    assert settings == Settings()
    assert settings.dtype == "float16"
    assert settings.backward is True
    assert settings.underflow_share == 0.25
    assert settings.underflow_min_count == 16
    assert settings.max_warnings == 20
    assert settings.upstream_depth == 12
    assert settings.select == ("NH",)
    assert settings.ignore == ()
    assert settings.fail_on == "error"


def test_empty_config_file_keeps_defaults(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, "# nothing here\n"))
    assert settings == Settings()
    assert set(settings.sources.values()) == {"default"}


# -- config file and overrides -----------------------------------------------------------------


def test_config_file_overrides_keys_and_records_source(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        "dtype: bfloat16\nbackward: false\nunderflow_share: 0.5\nmax_warnings: 3\n"
        "select: [nh1, NH2]\nfail_on: warning\n",
    )
    settings = load_settings(path)
    assert settings.dtype == "bfloat16"
    assert settings.backward is False
    assert settings.underflow_share == 0.5
    assert settings.max_warnings == 3
    assert settings.select == ("NH1", "NH2")
    assert settings.fail_on == "warning"
    assert settings.device == "auto"  # untouched
    overridden = {"dtype", "backward", "underflow_share", "max_warnings", "select", "fail_on"}
    for key in KEYS:
        expected = str(path) if key in overridden else "default"
        assert settings.sources[key] == expected, key


def test_int_setting_given_as_int_stays_int_and_float_setting_becomes_float(
    tmp_path: Path,
) -> None:
    settings = load_settings(_config(tmp_path, "underflow_share: 1\nupstream_depth: 4\n"))
    assert settings.underflow_share == 1.0
    assert type(settings.underflow_share) is float
    assert settings.upstream_depth == 4
    assert type(settings.upstream_depth) is int


def test_single_string_rule_code_becomes_a_tuple(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, "ignore: nh502\n"))
    assert settings.ignore == ("NH502",)


def test_cli_overrides_beat_file_and_none_is_skipped(tmp_path: Path) -> None:
    path = _config(tmp_path, "dtype: bfloat16\nmax_warnings: 3\nbackward: false\n")
    settings = load_settings(
        path,
        overrides={"dtype": "float16", "max_warnings": None, "device": "cpu", "ignore": None},
    )
    assert settings.dtype == "float16"
    assert settings.sources["dtype"] == "cli"
    assert settings.max_warnings == 3
    assert settings.sources["max_warnings"] == str(path)
    assert settings.backward is False
    assert settings.sources["backward"] == str(path)
    assert settings.device == "cpu"
    assert settings.sources["device"] == "cli"
    assert settings.ignore == ()
    assert settings.sources["ignore"] == "default"


def test_cli_overrides_without_a_file() -> None:
    settings = load_settings(overrides={"fail_on": "warning", "select": ["nh9"]})
    assert settings.fail_on == "warning"
    assert settings.select == ("NH9",)
    assert settings.sources["fail_on"] == "cli"
    assert settings.sources["select"] == "cli"
    assert settings.sources["dtype"] == "default"


def test_sources_do_not_take_part_in_equality(tmp_path: Path) -> None:
    from_file = load_settings(_config(tmp_path, "dtype: float16\n"))
    assert from_file.sources["dtype"] != "default"
    assert from_file == load_settings()


# -- errors -----------------------------------------------------------------------------------


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = _config(tmp_path, "dtype: float16\nthreshold: 3\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown key 'threshold' (known keys: ")
    assert ("backward, device, dtype, fail_on, fix_device, grad_scale, grad_underflow_share, "
            "ignore") in message


def test_unknown_key_on_command_line() -> None:
    with pytest.raises(ConfigError, match=r"^command line: unknown key 'bogus'"):
        load_settings(overrides={"bogus": 1})


def test_sources_is_not_a_settable_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'sources'"):
        load_settings(_config(tmp_path, "sources: {}\n"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("dtype: float8\n", "'dtype' must be one of float16, bfloat16, float32, got 'float8'"),
        ("dtype: 16\n", "'dtype' must be a string, got 16"),
        ("device: tpu\n", "'device' must be one of auto, cpu, cuda, got 'tpu'"),
        ("mode: eager\n", "'mode' must be one of autocast, half, got 'eager'"),
        ("fail_on: info\n", "'fail_on' must be one of error, warning, got 'info'"),
        ('backward: "yes"\n', "'backward' must be true or false, got 'yes'"),
        ("backward: 1\n", "'backward' must be true or false, got 1"),
        ("underflow_share: -1\n", "'underflow_share' must be a finite number >= 0, got -1"),
        ("underflow_share: high\n", "'underflow_share' must be a number, got 'high'"),
        ("max_warnings: true\n", "'max_warnings' must be a number, got True"),
        ("upstream_depth: -2\n", "'upstream_depth' must be a finite number >= 0, got -2"),
        ("select: [1, 2]\n", "'select' must be a list of rule codes"),
        ("ignore: {NH1: true}\n", "'ignore' must be a list of rule codes"),
    ],
)
def test_wrong_type_or_choice_names_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == f"{path}: {fragment}"


def test_wrong_value_on_command_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides={"dtype": "float8"})
    assert str(info.value) == (
        "command line: 'dtype' must be one of float16, bfloat16, float32, got 'float8'"
    )


@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_non_finite_number_for_int_setting_is_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="max_warnings"):
        load_settings(_config(tmp_path, f"max_warnings: {value}\n"))


def test_fraction_for_int_setting_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="underflow_min_count"):
        load_settings(_config(tmp_path, "underflow_min_count: 2.7\n"))


@pytest.mark.parametrize("value", ["1.5", ".nan"])
def test_underflow_share_out_of_range_is_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="underflow_share"):
        load_settings(_config(tmp_path, f"underflow_share: {value}\n"))


def test_invalid_yaml(tmp_path: Path) -> None:
    path = _config(tmp_path, "select: [NH1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value).startswith(f"config file {path} is not valid YAML: ")


@pytest.mark.parametrize("text", ["- dtype\n- float16\n", "just a string\n", "42\n"])
def test_non_mapping_yaml(tmp_path: Path, text: str) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == f"config file {path} must hold a mapping of settings"


def test_unsafe_yaml_tag_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, "dtype: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_settings(path)


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == f"cannot read config file {path}: No such file or directory"


# -- rule selection ---------------------------------------------------------------------------


def test_rule_enabled_by_default() -> None:
    settings = load_settings()
    assert settings.rule_enabled("NH001")
    assert settings.rule_enabled("NH102")
    assert settings.rule_enabled("NH900")


def test_rule_enabled_with_select_and_ignore_prefixes(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, "select: [NH1]\nignore: [NH102]\n"))
    assert settings.select == ("NH1",)
    assert settings.ignore == ("NH102",)
    assert settings.rule_enabled("NH101")
    assert settings.rule_enabled("NH103")
    assert settings.rule_enabled("NH109")
    assert not settings.rule_enabled("NH102")
    assert not settings.rule_enabled("NH001")
    assert not settings.rule_enabled("NH201")
    assert not settings.rule_enabled("NH900")


def test_rule_enabled_with_several_prefixes() -> None:
    settings = Settings(select=("NH0", "NH5"), ignore=("NH50",))
    assert settings.rule_enabled("NH001")
    assert not settings.rule_enabled("NH501")
    assert not settings.rule_enabled("NH502")
    assert not settings.rule_enabled("NH101")


def test_empty_select_enables_nothing() -> None:
    settings = Settings(select=())
    assert not settings.rule_enabled("NH001")


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("select: []\n", {}, r"nh\.yaml: 'select' \[\] leaves no rule to run"),
        ("ignore: [NH]\n", {}, r"nh\.yaml: 'select' \[NH\] with 'ignore' \[NH\] leaves no"),
        ("", {"select": ["NH1"], "ignore": ["NH1"]}, r"^command line: 'select' \[NH1\] with"),
        ("select: [NH5]\n", {"ignore": ["NH"]}, r"nh\.yaml and command line: 'select' \[NH5\]"),
    ],
)
def test_a_selection_that_leaves_no_rule_is_refused(
    tmp_path: Path, text: str, overrides: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(_config(tmp_path, text), overrides)


def test_a_selection_that_leaves_some_rule_is_kept(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, "ignore: [NH1, NH2]\n"), {"select": ["NH1", "NH5"]})
    assert settings.rule_enabled("NH501") and not settings.rule_enabled("NH101")


def test_a_key_given_twice_in_yaml_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, "fail_on: warning\ndtype: float16\nfail_on: error\n")
    with pytest.raises(ConfigError, match=r"nh\.yaml: key 'fail_on' is given twice \(lines 1 and"):
        load_settings(path)


def test_a_yaml_merge_key_may_repeat_what_it_merges(tmp_path: Path) -> None:
    path = _config(tmp_path, "base: &b {fail_on: error}\n<<: *b\nfail_on: warning\n")
    assert read_config_file(path) == {"base": {"fail_on": "error"}, "fail_on": "warning"}


def test_resolved_device_explicit() -> None:
    assert Settings(device="cpu").resolved_device() == "cpu"
    if torch.cuda.is_available():
        assert Settings(device="cuda").resolved_device() == "cuda"
    else:
        with pytest.raises(ConfigError, match="CUDA is not available"):
            Settings(device="cuda").resolved_device()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("none", None),
        ("65536", 65536.0),
        ("1e4", 1e4),
        ("2**16", 65536.0),
        ("'2 ** 10'", 1024.0),
        ("2^3", 8.0),
        ("dynamic", "dynamic"),
        ("Dynamic", "dynamic"),
    ],
)
def test_grad_scale_accepts_none_dynamic_or_positive(
    tmp_path: Path, text: str, value: float | None
) -> None:
    assert load_settings(_config(tmp_path, f"grad_scale: {text}\n")).grad_scale == value


def test_grad_scale_defaults_to_gradscalers_dynamic_policy() -> None:
    settings = load_settings()
    assert settings.grad_scale == "dynamic" and settings.dynamic_scale
    assert settings.loss_scale() == 2.0**16
    assert settings.sources["grad_scale"] == "default"
    assert load_settings(None, {"grad_scale": "none"}).loss_scale() == 1.0


@pytest.mark.parametrize("text", ["0", "-2", ".inf", "yes", "[1]", "2**", "2**x", "2**5000"])
def test_grad_scale_rejects_the_rest(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="'grad_scale' must be none, dynamic or a positive"):
        load_settings(_config(tmp_path, f"grad_scale: {text}\n"))


def test_known_codes_match_the_registry() -> None:
    """Selectors are checked against rule-module names (no torch import): keep them in sync."""
    from nan_hunter.project.config import known_codes
    from nan_hunter.rules import all_rules

    assert known_codes() == {rule.code for rule in all_rules()}


@pytest.mark.parametrize("selector", ["NX101", "", "NH1011", "E501", "nh9999"])
def test_unknown_selectors_are_refused(selector: str) -> None:
    from nan_hunter.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown rule code"):
        load_settings(None, {"select": [selector]})
