"""The rule registry: one module per code under rules/, discovered, each rule a detector."""

from __future__ import annotations

from pathlib import Path

import pytest

from nan_hunter.rules import all_rules, get_rule
from nan_hunter.rules.registry import Rule, SiteRule, register, site_rules

RULES = Path(__file__).resolve().parents[1] / "nan_hunter" / "rules"


def test_every_rule_module_is_discovered_and_registers_its_own_code() -> None:
    modules = sorted(p.stem for p in RULES.glob("nh*.py"))
    assert [f"nh{rule.code[2:]}" for rule in all_rules()] == [m.split("_")[0] for m in modules]
    for rule in all_rules():
        module = type(rule).__module__.rpartition(".")[2]
        assert module.startswith(rule.code.lower() + "_"), (rule.code, module)


def test_a_code_registered_twice_is_an_error() -> None:
    class Again(Rule):
        code = "NH101"

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)
    assert type(get_rule("NH101")).__name__ != "Again"


def test_site_rules_detect_and_origin_rules_classify() -> None:
    assert [r.code for r in site_rules("inputs")] == ["NH001"]
    assert sorted(r.code for r in site_rules("pass")) == [
        "NH002", "NH003", "NH004", "NH005", "NH402", "NH501", "NH502", "NH503", "NH601", "NH602",
        "NH603", "NH604", "NH609",
    ]
    for rule in all_rules():
        if isinstance(rule, SiteRule):
            assert type(rule).detect is not SiteRule.detect, rule.code
        else:
            assert type(rule).matches is not Rule.matches, rule.code
