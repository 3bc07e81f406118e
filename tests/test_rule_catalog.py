"""``nan_hunter/report/rules.json`` (what SARIF says about each rule, readable without torch)
is the registry's rules, in its order. After changing a rule's name, severity, summary or doc:
``python -m pytest tests/test_rule_catalog.py --update-golden`` writes it anew."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.project.config import Settings
from nan_hunter.report import catalog
from nan_hunter.report.catalog import RuleInfo, render_catalog
from nan_hunter.rules.registry import all_rules
from tests.conftest import ROOT

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


def test_nh502_says_its_threshold_as_the_setting_is() -> None:
    """NH502 warns at ``underflow_share`` (25% by default), not when "most" values are
    subnormal: its description and the docs that describe it say the default as it is."""
    share = f"{Settings().underflow_share:.0%}"
    assert share == "25%"
    rule = next(r for r in all_rules() if r.code == "NH502")
    assert rule.summary == (
        "At least 25% of an FP16 result's nonzero values (underflow_share) are below FP16's "
        "smallest normal (6.1e-5)."
    )
    assert "(default 25%)" in rule.doc and "(default 16)" in rule.doc
    for name in ("README.md", "docs/rules.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        line = next(line for line in text.splitlines() if "NH502" in line)
        assert f"at least {share} (`underflow_share`)" in line, (name, line)
        assert "mostly" not in line and "most nonzero" not in line, (name, line)
    scan_doc = (ROOT / "docs/scan.md").read_text(encoding="utf-8")
    assert f"results with at least {share} (`underflow_share`) of their nonzero\n" in scan_doc
