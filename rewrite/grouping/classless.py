"""Rules that select by class, on a graph whose module calls have no class.

A graph read from ONNX node names (:mod:`rewrite.frontends.onnx.names`) knows each module's
path, not its class: a ``class`` selector matches nothing there. Instead of one "matches
nothing" warning per such rule, grouping says it once, names the rules, and shows a ``path``
rule that selects the model's most repeated modules (its layers), as ``rewrite suggest``
writes them.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from rewrite.compile import RuleSet
from rewrite.errors import Diagnostic
from rewrite.ir import Graph
from rewrite.lang import ast

NO_CLASSES = "no module classes"
"""How the warning starts (the CLI names the model before it)."""


def uses_class(selector: ast.Selector | None) -> bool:
    """Whether ``selector`` has a ``class`` selector anywhere in it."""
    if isinstance(selector, ast.ClassSelector):
        return True
    if isinstance(selector, ast.NotSelector):
        return uses_class(selector.operand)
    if isinstance(selector, ast.BoolSelector):
        return any(uses_class(s) for s in selector.operands)
    return False


def layers_rule(graph: Graph) -> str | None:
    """``group path P``: P the sibling glob with the most calls (ties: the outermost), None
    when no module repeats."""
    counts = Counter(call.siblings for call in graph.calls if "*" in call.siblings)
    if not counts:
        return None
    glob = min(counts, key=lambda g: (-counts[g], g.count("."), g))
    return f"group path {glob}" if counts[glob] > 1 else None


def class_rules_warning(rules: RuleSet, graph: Graph, hits: Counter
                        ) -> tuple[list[Diagnostic], set[int]]:
    """The one warning about the class rules that matched nothing on a graph whose calls have
    no class, and the orders of those rules (their own warnings are left out)."""
    if not graph.calls or any(call.cls for call in graph.calls):
        return [], set()
    silent = [r for r in rules.rules if hits[r.order] == 0 and uses_class(r.selector)]
    if not silent:
        return [], set()
    example = layers_rule(graph)
    instead = f"select by path instead, e.g. `{example}`" if example else "select by path"
    message = (f"{NO_CLASSES}: this model's module calls come from its node names, which carry "
               f"paths but no classes, so class selectors match nothing ({_origins(silent)}); "
               f"{instead} (rewrite suggest MODEL writes such rules)")
    return [Diagnostic("warning", message)], {r.order for r in silent}


def _origins(rules: Iterable) -> str:
    names = [r.origin for r in rules]
    return (f"rule {names[0]}" if len(names) == 1
            else f"{len(names)} rules: {', '.join(names)}")
