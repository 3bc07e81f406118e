"""The rules' descriptions for the output formats, read from ``rules.json`` beside this module.

SARIF lists every rule (id, name, descriptions, default level). The rule modules import torch;
the command line's own process, which only renders the report its scan process sends back,
must not (``tests/hostile/test_parent_process.py``). So the descriptions are kept in a data file
generated from the registry: ``tests/test_rule_catalog.py`` fails when it differs from the
rules, and ``python -m pytest tests/test_rule_catalog.py --update-golden`` writes it anew.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources

from nan_hunter.findings import Severity

CATALOG = "rules.json"


@dataclass(frozen=True)
class RuleInfo:
    """What an output format says about a rule."""

    code: str
    name: str
    severity: Severity
    summary: str
    doc: str

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "severity": self.severity.value}


@lru_cache(maxsize=1)
def rule_catalog() -> tuple[RuleInfo, ...]:
    """Every rule, in the registry's order."""
    text = (resources.files("nan_hunter.report") / CATALOG).read_text(encoding="utf-8")
    return tuple(
        RuleInfo(r["code"], r["name"], Severity(r["severity"]), r["summary"], r["doc"])
        for r in json.loads(text)
    )


def render_catalog(rules: list[RuleInfo]) -> str:
    """The text of ``rules.json`` for ``rules``."""
    return json.dumps([r.to_dict() for r in rules], indent=2, ensure_ascii=False) + "\n"
