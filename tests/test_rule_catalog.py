"""``nan_hunter/report/rules.json`` (what SARIF says about each rule, readable without torch)
is the registry's rules, in its order. After changing a rule's name, severity, summary or doc:
``python -m pytest tests/test_rule_catalog.py --update-golden`` writes it anew."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.report import catalog
from nan_hunter.report.catalog import RuleInfo, render_catalog
from nan_hunter.rules.registry import all_rules

FILE = Path(catalog.__file__).with_name(catalog.CATALOG)


def test_the_catalog_is_the_registry(update_golden: bool) -> None:
    rules = [RuleInfo(r.code, r.name, r.severity, r.summary, r.doc) for r in all_rules()]
    expected = render_catalog(rules)
    if update_golden:
        FILE.write_text(expected, encoding="utf-8")
        catalog.rule_catalog.cache_clear()
    assert FILE.read_text(encoding="utf-8") == expected, (
        "rules.json differs from the rules: run "
        "python -m pytest tests/test_rule_catalog.py --update-golden"
    )
    assert list(catalog.rule_catalog()) == rules
    assert len(rules) >= 15 and len({r.code for r in rules}) == len(rules)
