"""Which module calls become groups: the winning group or flat rule of each call.

A call is asked about by its own path and class; ``op`` tests look at every node inside the
call, tag tests require every node inside the call to carry the tag (see
``rewrite.compile.selectors``). Among matching rules the highest ``priority`` wins, then the
rule written last.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from rewrite.compile import Facts, Rule
from rewrite.compile.selectors import uses
from rewrite.ir import Graph, ModuleCall, Stack
from rewrite.lang import ast


def _call_contents(
    graph: Graph, stacks: list[Stack], tags: list[Mapping[str, str]]
) -> tuple[dict[ModuleCall, set[str]], dict[ModuleCall, dict[str, str]]]:
    """Per call: the op targets of its nodes and the tags all of its nodes share."""
    ops: dict[ModuleCall, set[str]] = {}
    common: dict[ModuleCall, dict[str, str]] = {}
    for node in graph.nodes:
        node_tags = tags[node.index]
        for call in stacks[node.index]:
            ops.setdefault(call, set()).add(node.target)
            shared = common.get(call)
            if shared is None:
                common[call] = dict(node_tags)
            elif shared:
                for key in [k for k, v in shared.items() if node_tags.get(k) != v]:
                    del shared[key]
    return ops, common


def decide_calls(
    graph: Graph,
    calls: list[ModuleCall],
    stacks: list[Stack],
    tags: list[Mapping[str, str]],
    rules: tuple[Rule, ...],
    hits: Counter,
) -> dict[ModuleCall, Rule]:
    """The group rule of every call that becomes a group (flat and unmatched calls left out)."""
    if not rules:
        return {}
    needs_contents = any(
        uses(r.selector, ast.OpSelector) or uses(r.selector, ast.TagSelector) for r in rules
    )
    ops: dict[ModuleCall, set[str]] = {}
    common: dict[ModuleCall, dict[str, str]] = {}
    if needs_contents:
        ops, common = _call_contents(graph, stacks, tags)
    ranked = sorted(rules, key=lambda r: (r.priority, r.order), reverse=True)
    chosen: dict[ModuleCall, Rule] = {}
    for call in calls:
        facts = Facts((call.path,), (call.cls,), ops.get(call, ()), common.get(call, {}))
        winner = None
        for rule in ranked:
            if rule.predicate(facts):
                hits[rule.order] += 1
                if winner is None:
                    winner = rule
        if winner is not None and winner.kind == "group":
            chosen[call] = winner
    return chosen
