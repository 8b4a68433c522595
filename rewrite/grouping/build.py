"""Rules x IR -> :class:`GroupTree`: the grouping stage from start to end.

1. place nodes without a module stack with their users (``placement``);
2. apply tag rules (``tagging``);
3. choose the group or flat rule of every module call (``decide``);
4. with a split, assign split components (``split``);
5. give every node its path of groups, check that the groups can be outlined
   (``validate``), and build the tree.

Everything is numpy array passes over the graph's columns (``Graph.columns``), the tree of
distinct stacks and the calls; Python work is per distinct class, target and tag set and per
rule, never per node or per call. The result is columns too (:class:`GroupTable`); the
:class:`Group` records are built when someone reads them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rewrite._gc import gc_paused
from rewrite.compile import RuleSet
from rewrite.errors import Diagnostic, GroupingError
from rewrite.grouping.decide import decide_calls
from rewrite.grouping.placement import place_nodes
from rewrite.grouping.split import split_components
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import CallSubjects
from rewrite.grouping.tagging import TagTable, apply_tag_rules
from rewrite.grouping.tree import GroupTable, GroupTree, Segments
from rewrite.grouping.validate import Cycle, find_cycle, group_spans
from rewrite.ir import Graph

def group_graph(rules: RuleSet, graph: Graph) -> GroupTree:
    """Group ``graph`` by ``rules``; raises :class:`GroupingError` if it cannot be done."""
    with gc_paused():
        return _group(rules, graph)


def _group(rules: RuleSet, graph: Graph) -> GroupTree:
    columns = graph.columns
    table = StackTable(columns, graph.calls)
    placement = place_nodes(columns, table)
    table.tree()  # placement may have added stacks; from here on the table is fixed
    sid = placement.stack
    hits: Counter = Counter()
    tag_table = TagTable(columns.tag_sets)
    tags_id = apply_tag_rules(table, sid, columns.target_id, columns.targets,
                              columns.tags_id.astype(np.int64), tag_table, columns.is_io,
                              rules.tag_rules, hits)
    subjects = CallSubjects(table, sid, ~columns.is_io, columns.target_id, columns.targets,
                            tags_id, tag_table.values)
    decisions = decide_calls(subjects, rules.group_rules, hits)
    components: tuple = ()
    comp = None
    if rules.split is not None:
        found, comp = split_components(graph, tags_id, tag_table.values, rules.split)
        components = tuple(found)
    segments = Segments(table.calls, decisions, components, rules.split)

    parent, segment, depth, stack_group = _stack_groups(table, decisions.grouped)
    group_of = stack_group[sid]
    if comp is not None:
        parent, segment, depth, group_of = _split_groups(parent, segment, depth, group_of, comp)
    spans = group_spans(group_of, parent, depth, placement.position)
    groups = GroupTable(parent, segment, depth, spans.count, spans.first)
    cycle = find_cycle(columns, group_of, groups, spans)
    if cycle is not None:
        _raise_cycle(graph, rules, segments, cycle)
    return GroupTree(graph, groups, segments, group_of, tags_id, tuple(tag_table.values),
                     tuple(_warnings(rules, hits)))


def _stack_groups(table: StackTable, grouped: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The groups made by the grouped calls: ``(parent, segment, depth)`` per group (group 0
    is the root) and per stack id the innermost group holding its nodes.

    Level by level down the tree of stacks: a stack's group is its parent stack's, or, if its
    last call is grouped, the group of that call under it (one per distinct pair).
    """
    stack_parent, last, _, levels = table.tree()
    calls = max(len(grouped), 1)
    stack_group = np.zeros(len(stack_parent), dtype=np.int64)
    parent = [np.full(1, -1, dtype=np.int64)]
    segment = [np.zeros(1, dtype=np.int64)]
    depth = np.zeros(1, dtype=np.int64)
    known = np.zeros(0, dtype=np.int64)  # (parent group, call) pairs made so far, sorted
    known_id = np.zeros(0, dtype=np.int64)
    size = 1
    for level in levels:
        base = stack_group[stack_parent[level]]
        call = last[level]
        is_group = grouped[call]
        stack_group[level] = base
        if not is_group.any():
            continue
        pairs = base[is_group] * calls + call[is_group]
        unique, inverse = np.unique(pairs, return_inverse=True)
        ids = np.empty(len(unique), dtype=np.int64)
        at = np.minimum(np.searchsorted(known, unique), max(len(known) - 1, 0))
        old = (known[at] == unique) if len(known) else np.zeros(len(unique), dtype=bool)
        ids[old] = known_id[at[old]]
        new = unique[~old]
        ids[~old] = np.arange(size, size + len(new), dtype=np.int64)
        size += len(new)
        above = new // calls
        parent.append(above)
        segment.append(new % calls)
        depth = np.concatenate([depth, depth[above] + 1])
        stack_group[level[is_group]] = ids[inverse.reshape(-1)]
        merged = np.concatenate([known, new])
        by_pair = np.argsort(merged, kind="stable")
        known, known_id = merged[by_pair], np.concatenate([known_id, ids[~old]])[by_pair]
    return np.concatenate(parent), np.concatenate(segment), depth, stack_group


def _split_groups(parent: np.ndarray, segment: np.ndarray, depth: np.ndarray,
                  group_of: np.ndarray, comp: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Put each split component at the top: the groups of a component's nodes are copied
    under it (a module group cut by the split becomes one group per component)."""
    size = len(parent)
    key = (comp + 1) * size + group_of  # (component + 1, group); component -1: the top level
    space = (int(comp.max(initial=-1)) + 2) * size
    if space <= 4 * len(key) + 1024:  # small key space: presence by counting, no sort
        present = np.bincount(key, minlength=space) > 0
        present[0] = True
    else:
        present = None
    keys = np.flatnonzero(present) if present is not None else np.union1d(np.unique(key), 0)
    while True:  # add every ancestor: (c, parent group), up to (c, root), then the root
        c, g = np.divmod(keys, size)
        up = np.where(g > 0, c * size + parent[g], 0)
        if present is not None:
            missing = up[~present[up]]
            if missing.size == 0:
                break
            present[missing] = True
            keys = np.flatnonzero(present)
        else:
            grown = np.union1d(keys, up)
            if len(grown) == len(keys):
                break
            keys = grown
    c, g = np.divmod(keys, size)  # sorted by (c, g): parents come first
    at = np.searchsorted(keys, np.where(g > 0, c * size + parent[g], 0))
    new_parent = np.where(keys == 0, -1, at)
    new_segment = np.where(g > 0, segment[g], -c)
    new_depth = depth[g] + (c > 0)
    return new_parent, new_segment, new_depth, np.searchsorted(keys, key)


def _warnings(rules: RuleSet, hits: Counter) -> list[Diagnostic]:
    return [
        Diagnostic("warning", f"{rule.kind} rule matches nothing in this model", rule.span)
        for rule in rules.rules
        if hits[rule.order] == 0
    ]


def _raise_cycle(graph: Graph, rules: RuleSet, segments: Segments, cycle: Cycle) -> None:
    nodes = graph.nodes
    names: list[str] = []
    for edge in cycle.edges:
        for i in edge:
            if nodes[i].name not in names:
                names.append(nodes[i].name)
    where = "/".join(segments.key(s) for s in cycle.parent) or "the top level"
    if not cycle.groups:  # pragma: no cover - a cycle between loose nodes is not a graph
        raise GroupingError(f"cycle between nodes in {where}", nodes=tuple(names))
    rule = segments.rule(cycle.groups[0])
    what = ", ".join(segments.key(g) for g in cycle.groups)
    raise GroupingError(
        f"group {what} cannot be outlined: data leaves it and comes back in through other "
        f"nodes of {where} (a cycle); flatten it, or group the nodes in between with it",
        rule=rule.origin if rule is not None else None,
        nodes=tuple(names),
    )
