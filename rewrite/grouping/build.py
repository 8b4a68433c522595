"""Rules x IR -> :class:`GroupTree`: the grouping stage from start to end.

1. place nodes without a module stack (``placement``);
2. apply tag rules (``tagging``);
3. choose the group rule of every module call (``decide``);
4. with a split, assign split components (``split``);
5. give every node its path of groups, check that the groups can be outlined
   (``validate``), and build the tree.

Everything per node is a few dictionary lookups; selectors run once per module call.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Hashable

from rewrite.compile import Rule, RuleSet
from rewrite.compile import templates
from rewrite.errors import Diagnostic, GroupingError
from rewrite.grouping.decide import decide_calls
from rewrite.grouping.placement import place_nodes
from rewrite.grouping.split import Component, split_components
from rewrite.grouping.tagging import apply_tag_rules
from rewrite.grouping.tree import Group, GroupTree
from rewrite.grouping.validate import find_cycle
from rewrite.ir import Graph, ModuleCall

SPLIT_DOMAIN = "pkg.rewrite"


def _segment_key(segment: Hashable) -> str:
    if isinstance(segment, ModuleCall):
        return segment.key
    assert isinstance(segment, Component)
    return segment.name


def _node_paths(graph, stacks, chosen, components, comp_of) -> list[tuple]:
    cache: dict = {}
    paths: list[tuple] = []
    empty: tuple = ()
    for node in graph.nodes:
        stack = stacks[node.index]
        comp = comp_of[node.index] if comp_of is not None else None
        cache_key = (comp, stack)
        path = cache.get(cache_key)
        if path is None:
            path = tuple(c for c in stack if c in chosen)
            if comp is not None:
                path = (components[comp],) + path
            path = cache.setdefault(cache_key, path if path else empty)
        paths.append(path)
    return paths


def _unmatched_warnings(rules: RuleSet, hits: Counter) -> list[Diagnostic]:
    return [
        Diagnostic("warning", f"{rule.kind} rule matches nothing in this model", rule.span)
        for rule in rules.rules
        if hits[rule.order] == 0
    ]


def _raise_cycle(graph: Graph, paths, chosen: dict[ModuleCall, Rule], cycle) -> None:
    parent, members, crossing = cycle
    groups = [m for m in members if not (isinstance(m, tuple) and m and m[0] == "node")]
    names = sorted({graph.nodes[i].name for edge in crossing for i in edge})
    where = "/".join(_segment_key(s) for s in parent) or "the top level"
    if groups:
        group = groups[0]
        rule = chosen.get(group) if isinstance(group, ModuleCall) else None
        what = ", ".join(_segment_key(g) for g in groups)
        raise GroupingError(
            f"group {what} cannot be outlined: data leaves it and comes back in through other "
            f"nodes of {where} (a cycle); flatten it, or group the nodes in between with it",
            rule=rule.origin if rule else None,
            nodes=tuple(names),
        )
    raise GroupingError(f"cycle between nodes in {where}", nodes=tuple(names))  # pragma: no cover


def group_graph(rules: RuleSet, graph: Graph) -> GroupTree:
    """Group ``graph`` by ``rules``; raises :class:`GroupingError` if it cannot be done."""
    users = graph.users()
    stacks = place_nodes(graph, users)
    hits: Counter = Counter()
    tags = apply_tag_rules(graph, stacks, rules.tag_rules, hits)
    chosen = decide_calls(graph, list(graph.calls), stacks, tags, rules.group_rules, hits)

    components: list[Component] = []
    comp_of = None
    if rules.split is not None:
        components, comp_of = split_components(graph, tags, users, rules.split)
    paths = _node_paths(graph, stacks, chosen, components, comp_of)

    cycle = find_cycle(graph, paths)
    if cycle is not None:
        _raise_cycle(graph, paths, chosen, cycle)

    root = _build_tree(graph, paths, chosen, rules)
    owner = tuple(_path_id(p) for p in paths)
    return GroupTree(graph, root, owner, tuple(tags), tuple(_unmatched_warnings(rules, hits)))


_ID_CACHE: dict = {}


def _path_id(path: tuple) -> str:
    return "/".join(_segment_key(s) for s in path)


def _build_tree(graph: Graph, paths: list[tuple], chosen: dict[ModuleCall, Rule], rules: RuleSet) -> Group:
    direct: dict[tuple, list[int]] = defaultdict(list)
    children: dict[tuple, dict[tuple, None]] = defaultdict(dict)
    seen: set[tuple] = set()
    for node in graph.nodes:
        path = paths[node.index]
        direct[path].append(node.index)
        if path not in seen:
            # register every prefix with its parent, in order of first appearance
            for depth in range(len(path), 0, -1):
                prefix = path[:depth]
                if prefix in seen:
                    break
                seen.add(prefix)
                children[prefix[:-1]][prefix] = None
            seen.add(path)

    def make(path: tuple) -> Group:
        kids = tuple(make(child) for child in children.get(path, {}))
        own = tuple(direct.get(path, ()))
        size = len(own) + sum(k.size for k in kids)
        if not path:
            return Group("", "root", None, None, graph.root_class or "main", "", kids, own, size)
        segment = path[-1]
        gid = _path_id(path)
        if isinstance(segment, ModuleCall):
            rule = chosen[segment]
            fields = templates.call_fields(segment)
            return Group(
                gid, "module", segment, rule,
                templates.render(rule.name_template, fields),
                templates.render(rule.domain_template, fields),
                kids, own, size,
            )
        return Group(gid, "component", None, rules.split, segment.name, SPLIT_DOMAIN, kids, own,
                     size, tag_value=segment.value)

    return make(())
