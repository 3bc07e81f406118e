"""The rule catalog: one module per finding code, collected in one registry."""

from nan_hunter.rules.registry import Candidate, FixPlan, Rule, all_rules, classify, get_rule

__all__ = ["Candidate", "FixPlan", "Rule", "all_rules", "classify", "get_rule"]
