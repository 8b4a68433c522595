"""Rules x IR -> :class:`GroupTree`: the grouping stage from start to end.

1. place nodes without a module stack with their users (``placement``);
2. apply tag rules (``tagging``);
3. choose the group or flat rule of every module call (``decide``);
4. with a split, assign split components (``split``);
5. give every node its path of groups, check that the groups can be outlined
   (``validate``; a group that cannot is an error or, by the rules' ``on cycle flatten``,
   dissolved into its parent: ``cycles``), and build the tree.

Everything is numpy array passes over the graph's columns (``Graph.columns``), the tree of
distinct stacks and the calls; Python work is per distinct class, target and tag set and per
rule, never per node or per call. The result is columns too (:class:`GroupTable`); the
:class:`Group` records are built when someone reads them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rewrite._shared.gc import gc_paused
from rewrite.compile import RuleSet
from rewrite.errors import Diagnostic
from rewrite.grouping.cycles import (
    Flattened,
    flatten_group,
    flattenable,
    flattened_warning,
    raise_cycle,
)
from rewrite.grouping.decide import decide_calls
from rewrite.grouping.measures import CallMeasures
from rewrite.grouping.placement import place_nodes
from rewrite.grouping.split import split_components
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import CallSubjects
from rewrite.grouping.tagging import apply_tag_rules
from rewrite.grouping.classless import class_rules_warning
from rewrite.grouping.tree import GroupTable, GroupTree, Segments
from rewrite.grouping.validate import find_cycle, group_spans
from rewrite.ir import Graph
from rewrite.ir.columns import TagSets

def group_graph(rules: RuleSet, graph: Graph) -> GroupTree:
    """Group ``graph`` by ``rules``; raises :class:`GroupingError` if it cannot be done."""
    with gc_paused():
        return _group(rules, graph)


def _group(rules: RuleSet, graph: Graph) -> GroupTree:
    columns = graph.columns
    table = StackTable(columns, graph.calls)
    placement = place_nodes(columns, table)
    sid = placement.stack
    hits: Counter = Counter()
    tag_table = TagSets(columns.tag_sets)  # grows as tag rules add tags
    measures = CallMeasures(table, sid, ~columns.is_io)  # each made on first use
    tags_id = apply_tag_rules(table, sid, columns.target_id, columns.targets,
                              columns.tags_id.astype(np.int64), tag_table, columns.is_io,
                              rules.tag_rules, hits, measures)
    subjects = CallSubjects(table, sid, ~columns.is_io, columns.target_id, columns.targets,
                            tags_id, tag_table.values, measures)
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
    flattened: list[Flattened] = []
    while True:
        spans = group_spans(group_of, parent, depth, placement.position)
        groups = GroupTable(parent, segment, depth, spans.count, spans.first)
        cycle = find_cycle(columns, group_of, groups, spans)
        if cycle is None:
            break
        if not (rules.on_cycle.flatten and flattenable(cycle)):
            raise_cycle(graph, segments, cycle)
        if not flattened:
            parent, group_of = parent.copy(), group_of.copy()
        flattened.append(flatten_group(graph, segments, groups, parent, group_of, cycle))
        depth = _depths(parent)
    warnings = _warnings(rules, graph, hits) + [flattened_warning(f) for f in flattened]
    return GroupTree(graph, groups, segments, group_of, tags_id, tuple(tag_table.values),
                     tuple(warnings), tuple(flattened), measures)


def _stack_groups(table: StackTable, grouped: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The groups made by the grouped calls: ``(parent, segment, depth)`` per group (group 0
    is the root) and per stack id the innermost group holding its nodes.

    Level by level down the tree of stacks: a stack's group is its parent stack's, or, if its
    last call is grouped, the group of that call under it: one group per distinct (parent
    group, call). A call normally ends one stack only, so that is one new group per grouped
    call of the level; otherwise the pairs are looked up one by one.
    """
    stack_parent, last, _, levels = table.tree()
    stack_group = np.zeros(len(stack_parent), dtype=np.int64)
    parent: list[np.ndarray] = [np.full(1, -1, dtype=np.int64)]
    segment: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    group_of_call = np.full(len(grouped), -1, dtype=np.int64)
    stamp = np.zeros(len(grouped), dtype=np.int64)
    pairs: dict[tuple[int, int], int] | None = None  # for the uncommon case
    size = 1
    for level in levels:
        base = stack_group[stack_parent[level]]
        call = last[level]
        is_group = grouped[call]
        stack_group[level] = base
        if not is_group.any():
            continue
        calls, bases = call[is_group], base[is_group]
        order = np.arange(len(calls), dtype=np.int64)
        stamp[calls] = order
        if pairs is None and (stamp[calls] == order).all() and (group_of_call[calls] < 0).all():
            ids = order + size
            parent.append(bases)
            segment.append(calls)
            size += len(calls)
        else:
            if pairs is None:
                pairs = dict(zip(zip(np.concatenate(parent).tolist(),
                                     np.concatenate(segment).tolist()), range(size)))
            made: list[tuple[int, int]] = []
            ids = np.empty(len(calls), dtype=np.int64)
            for k, pair in enumerate(zip(bases.tolist(), calls.tolist())):
                found = pairs.get(pair)
                if found is None:
                    found = pairs[pair] = size + len(made)
                    made.append(pair)
                ids[k] = found
            if made:
                parent.append(np.array([b for b, _ in made], dtype=np.int64))
                segment.append(np.array([c for _, c in made], dtype=np.int64))
                size += len(made)
        group_of_call[calls] = ids
        stack_group[level[is_group]] = ids
    parents, segments = np.concatenate(parent), np.concatenate(segment)
    return parents, segments, _depths(parents), stack_group


def _depths(parent: np.ndarray) -> np.ndarray:
    """Per group, its depth (parents have smaller ids): by pointer jumping."""
    depth = np.zeros(len(parent), dtype=np.int64)
    above = parent.copy()
    while True:
        has = above >= 0
        if not has.any():
            return depth
        depth[has] += 1
        above[has] = parent[above[has]]


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


NO_STRUCTURE = "no module structure"
"""How the warning about a model without module calls starts."""


def no_structure(kind: str, functions: int = 0) -> Diagnostic:
    """The warning for a model without module calls (it works, but stays flat); an ONNX model
    that already has ``functions`` (an output of rewrite, say) is named as such."""
    if kind == "onnx" and functions:
        missing = "torch.onnx module metadata (pkg.torch.onnx.name_scopes)"
        keep = (f"the model already has {functions} local functions (an outlined model?): "
                "rewrite does not look inside functions; give it the flat export instead")
    elif kind == "onnx":
        missing = "torch.onnx module metadata (pkg.torch.onnx.name_scopes)"
        keep = "export it with torch.onnx.export(..., dynamo=True) to keep it"
    else:
        missing = "nn_module_stack metadata"
        keep = "export an nn.Module with torch.export.export to keep it"
    return Diagnostic("warning", f"{NO_STRUCTURE}: no node carries {missing}, so group and flat "
                      f"rules have nothing to match and the result stays flat (tag and split "
                      f"rules still apply); {keep}")


_BRANCH_OPS = ("cond", "while_loop", "scan", "map_impl", "associative_scan")
"""Higher-order ops whose bodies' module calls torch.export does not record in the graph."""


def _warnings(rules: RuleSet, graph: Graph, hits: Counter) -> list[Diagnostic]:
    functions = len(getattr(graph.source, "functions", None) or ()) if graph.kind == "onnx" else 0
    first = [no_structure(graph.kind, functions)] if not graph.calls else []
    classless, said = class_rules_warning(rules, graph, hits)
    first += classless
    branches = sorted({t.rsplit(".", 1)[-1] for t in graph.columns.targets
                       if t.startswith("torch.ops.higher_order.")} & set(_BRANCH_OPS))
    why = (f"; this program calls {', '.join(branches)}: modules called inside its bodies "
           "are not grouped (torch.export records their calls only in the body graphs; the "
           "op stays in the group of the module that called it)") if branches else ""
    return first + [
        Diagnostic("warning", f"{rule.kind} rule matches nothing in this model"
                   + (why if rule.kind != "tag" else ""), rule.span)
        for rule in rules.rules
        if hits[rule.order] == 0 and rule.order not in said
    ]
