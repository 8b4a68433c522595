"""Tag rules: set tags on the nodes their selector matches (file order, later wins)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from rewrite.compile import Facts, Rule
from rewrite.ir import Graph, Stack


def apply_tag_rules(
    graph: Graph, stacks: list[Stack], rules: tuple[Rule, ...], hits: Counter
) -> list[Mapping[str, str]]:
    """Each node's tags after the tag rules; counts matches per rule in ``hits``."""
    tags: list[Mapping[str, str]] = [n.tags for n in graph.nodes]
    if not rules:
        return tags
    ordered = sorted(rules, key=lambda r: (r.priority, r.order))
    stack_facts: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for node in graph.nodes:
        if node.is_io:
            continue
        stack = stacks[node.index]
        paths_classes = stack_facts.get(id(stack))
        if paths_classes is None:
            paths_classes = (tuple(c.path for c in stack), tuple(c.cls for c in stack))
            stack_facts[id(stack)] = paths_classes
        current = tags[node.index]
        updated = None
        for rule in ordered:
            facts = Facts(paths_classes[0], paths_classes[1], (node.target,), updated or current)
            if rule.predicate(facts):
                hits[rule.order] += 1
                if updated is None:
                    updated = dict(current)
                updated.update(rule.assignments)
        if updated is not None:
            tags[node.index] = updated
    return tags
