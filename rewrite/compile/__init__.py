"""Stage 2: AST -> RuleSet of compiled matchers."""

from rewrite.compile.ruleset import Rule, RuleSet, Split, load_rules, parse_rules, shipped_rules
from rewrite.compile.selectors import Facts, Subjects, compile_mask, compile_selector

__all__ = [
    "Facts",
    "Rule",
    "RuleSet",
    "Split",
    "Subjects",
    "compile_mask",
    "compile_selector",
    "load_rules",
    "parse_rules",
    "shipped_rules",
]
