"""Rules x IR -> :class:`GroupTree`: the grouping stage from start to end.

1. place nodes without a module stack with their users (``placement``);
2. apply tag rules (``tagging``);
3. choose the group or flat rule of every module call (``decide``);
4. with a split, assign split components (``split``);
5. give every node its path of groups, check that the groups can be outlined
   (``validate``), and build the tree.

Per-node work is numpy array passes over the graph's columns (``Graph.columns``); selectors
run once per module call or per distinct (stack, target, tags), never per node and rule;
paths of groups are tuples of small ints (call ids, and ``-1 - k`` for split component k)
until the :class:`Group` records are made, once per group.
"""

from __future__ import annotations

from collections import Counter
import numpy as np

from rewrite.compile import Rule, RuleSet
from rewrite.compile.templates import Renderer
from rewrite.errors import Diagnostic, GroupingError
from rewrite._gc import gc_paused
from rewrite.grouping.decide import decide_calls
from rewrite.grouping.placement import place_nodes
from rewrite.grouping.split import Component, split_components
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import CallSubjects
from rewrite.grouping.tagging import TagTable, apply_tag_rules
from rewrite.grouping.tree import Group, GroupTree
from rewrite.grouping.validate import Cycle, Spans, find_cycle, group_spans
from rewrite.ir import Graph

SPLIT_DOMAIN = "pkg.rewrite"

Path = tuple[int, ...]


def group_graph(rules: RuleSet, graph: Graph) -> GroupTree:
    """Group ``graph`` by ``rules``; raises :class:`GroupingError` if it cannot be done."""
    with gc_paused():
        return _Grouping(rules, graph).run()


class _Grouping:
    def __init__(self, rules: RuleSet, graph: Graph) -> None:
        self.rules = rules
        self.graph = graph
        self.columns = graph.columns
        self.table = StackTable(self.columns, graph.calls)
        self.components: list[Component] = []
        self.chosen: list[Rule | None] = []

    def run(self) -> GroupTree:
        columns, table, rules = self.columns, self.table, self.rules
        placement = place_nodes(columns, table)
        sid = placement.stack
        hits: Counter = Counter()
        tag_table = TagTable(columns.tag_sets)
        tags_id = apply_tag_rules(table, sid, columns.target_id, columns.targets,
                                  columns.tags_id.astype(np.int64), tag_table, columns.is_io,
                                  rules.tag_rules, hits)
        subjects = CallSubjects(table, sid, ~columns.is_io, columns.target_id,
                                columns.targets, tags_id, tag_table.values)
        self.chosen = decide_calls(subjects, rules.group_rules, hits)

        comp = None
        if rules.split is not None:
            self.components, comp = split_components(self.graph, tags_id, tag_table.values,
                                                     rules.split)
        pid, paths = self._paths(sid, comp)
        parent = np.asarray(paths.parent, dtype=np.int64)
        depth = np.fromiter(map(len, paths.paths), dtype=np.int64, count=len(paths.paths))
        spans = group_spans(pid, parent, depth, placement.position)
        cycle = find_cycle(columns, pid, paths.paths, spans)
        if cycle is not None:
            self._raise_cycle(cycle)

        names = self._names(paths)
        root = self._tree(pid, paths, names, spans)
        ids = np.empty(len(names), dtype=object)
        ids[:] = names
        tag_sets = np.empty(len(tag_table.values), dtype=object)
        for i, tags in enumerate(tag_table.values):
            tag_sets[i] = tags
        return GroupTree(self.graph, root, tuple(ids[pid].tolist()),
                         tuple(tag_sets[tags_id].tolist()), tuple(self._warnings(hits)))

    def _paths(self, sid: np.ndarray, comp: np.ndarray | None) -> tuple[np.ndarray, _Paths]:
        """Per node the id of its path of groups, and the table of paths."""
        table = self.table
        # one more entry, False, for call id -1 (the "last call" of an empty stack)
        grouped = np.array([r is not None for r in self.chosen] + [False], dtype=bool)
        paths = _Paths()
        stack_pid = _stack_paths(table, grouped, paths)
        pid = stack_pid[sid]
        if comp is None:
            return pid, paths
        # split: each component is the outermost group of its nodes
        key = (comp + 1) * len(paths.paths) + pid
        used, inverse = np.unique(key, return_inverse=True)
        final = _Paths()
        remap = []
        for k in used.tolist():
            c, p = divmod(k, len(paths.paths))
            path = ((-c,) if c > 0 else ()) + paths.paths[p]
            remap.append(final.intern(path))
        return np.asarray(remap, dtype=np.int64)[inverse.reshape(-1)], final

    def _segment_key(self, segment: int) -> str:
        if segment >= 0:
            return self.table.calls[segment].key
        return self.components[-1 - segment].name

    def _names(self, paths: _Paths) -> list[str]:
        """Per path id: the ``/``-joined keys (parents come before their children)."""
        names = [""] * len(paths.paths)
        key = self._segment_key
        for k, (path, parent) in enumerate(zip(paths.paths, paths.parent)):
            if path:
                above = names[parent]
                names[k] = f"{above}/{key(path[-1])}" if above else key(path[-1])
        return names

    def _id(self, path: Path) -> str:
        return "/".join(self._segment_key(s) for s in path)

    def _warnings(self, hits: Counter) -> list[Diagnostic]:
        return [
            Diagnostic("warning", f"{rule.kind} rule matches nothing in this model", rule.span)
            for rule in self.rules.rules
            if hits[rule.order] == 0
        ]

    def _raise_cycle(self, cycle: Cycle) -> None:
        nodes = self.graph.nodes
        names: list[str] = []
        for edge in cycle.edges:
            for i in edge:
                if nodes[i].name not in names:
                    names.append(nodes[i].name)
        where = self._id(tuple(cycle.parent)) or "the top level"
        if not cycle.groups:  # pragma: no cover - a cycle between loose nodes is not a graph
            raise GroupingError(f"cycle between nodes in {where}", nodes=tuple(names))
        group = cycle.groups[0]
        rule = self.chosen[group] if group >= 0 else self.rules.split
        what = ", ".join(self._segment_key(g) for g in cycle.groups)
        raise GroupingError(
            f"group {what} cannot be outlined: data leaves it and comes back in through other "
            f"nodes of {where} (a cycle); flatten it, or group the nodes in between with it",
            rule=rule.origin if rule is not None else None,
            nodes=tuple(names),
        )

    def _tree(self, pid: np.ndarray, paths: _Paths, names: list[str], spans: Spans) -> Group:
        """The group tree: children in order of their first node (split components in their
        order), each group's direct nodes in graph order. Built bottom-up, one pass."""
        size = len(paths.paths)
        order = np.argsort(pid, kind="stable").tolist()
        bounds = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(np.bincount(pid, minlength=size), out=bounds[1:])
        bounds = bounds.tolist()
        count, first = spans.count.tolist(), spans.first.tolist()
        children: dict[int, list[int]] = {}
        for k, parent in enumerate(paths.parent):
            if parent >= 0 and count[k]:
                children.setdefault(parent, []).append(k)
        segments = [p[-1] if p else 0 for p in paths.paths]
        calls, chosen, render = self.table.calls, self.chosen, Renderer()
        split, components = self.rules.split, self.components
        made: list[Group | None] = [None] * size
        for k in sorted(range(1, size), key=lambda k: -len(paths.paths[k])):
            if not count[k]:
                continue
            kids_ids = children.get(k, ())
            if len(kids_ids) > 1:
                kids_ids.sort(key=lambda g: (0, -segments[g]) if segments[g] < 0 else (1, first[g]))
            kids = tuple([made[g] for g in kids_ids])
            own = tuple(order[bounds[k]:bounds[k + 1]])
            segment = segments[k]
            if segment >= 0:
                call, rule = calls[segment], chosen[segment]
                made[k] = Group(names[k], "module", call, rule,
                                render(rule.name_template, call),
                                render(rule.domain_template, call), kids, own, count[k])
            else:
                component = components[-1 - segment]
                made[k] = Group(names[k], "component", None, split, component.name,
                                SPLIT_DOMAIN, kids, own, count[k], tag_value=component.value)
        top = children.get(0, [])
        top.sort(key=lambda g: (0, -segments[g]) if segments[g] < 0 else (1, first[g]))
        kids = tuple([made[g] for g in top])
        own = tuple(order[bounds[0]:bounds[1]])
        return Group("", "root", None, None, self.graph.root_class or "main", "", kids, own,
                     len(own) + sum(kid.size for kid in kids))


def _stack_paths(table: StackTable, grouped: np.ndarray, paths: _Paths) -> np.ndarray:
    """Per stack id, the id of its path of groups (the grouped calls of the stack).

    Level by level: a stack's path is its parent stack's path, extended by its last call if
    that call is a group. New paths are made once per distinct (parent path, call).
    """
    start, flat = table.csr
    length = np.diff(start)
    parent = np.asarray(table.parent, dtype=np.int64)
    stack_pid = np.zeros(len(table), dtype=np.int64)
    last = np.where(length > 0, flat[np.maximum(start[1:] - 1, 0)] if len(flat) else 0, -1)
    # a usable parent has exactly one call less (frontends give it; else fold the calls)
    usable = (parent >= 0) & (parent < np.arange(len(table)))
    usable &= length == np.where(usable, length[np.maximum(parent, 0)] + 1, -1)
    for s in np.flatnonzero((length > 0) & ~usable).tolist():
        pid = 0
        for call in table.ids[s]:
            if grouped[call]:
                pid = paths.child(pid, call)
        stack_pid[s] = pid
    for d in range(1, int(length.max()) + 1 if len(length) else 1):
        level = np.flatnonzero(usable & (length == d))
        if level.size == 0:
            continue
        base = stack_pid[parent[level]]
        calls = last[level]
        is_group = grouped[calls]
        stack_pid[level] = base
        chosen = level[is_group]
        if chosen.size:
            pairs = base[is_group] * (len(grouped) + 1) + calls[is_group]
            unique, inverse = np.unique(pairs, return_inverse=True)
            made = [paths.child(int(b), int(c)) for b, c in
                    zip(*np.divmod(unique, len(grouped) + 1))]
            stack_pid[chosen] = np.asarray(made, dtype=np.int64)[inverse.reshape(-1)]
    return stack_pid


class _Paths:
    """Distinct paths of groups (tuples of segments), each with the id of its parent path;
    id 0 is the empty path (the top level). Parents get smaller ids than their children."""

    def __init__(self) -> None:
        self.paths: list[Path] = [()]
        self.parent: list[int] = [-1]
        self._ids: dict[Path, int] = {(): 0}
        self._child: dict[int, int] = {}

    def child(self, pid: int, segment: int) -> int:
        """The id of path ``pid`` extended by call ``segment`` (>= 0)."""
        key = pid << 32 | segment  # an int key: no tuple for the collector to scan
        found = self._child.get(key)
        if found is None:
            path = self.paths[pid] + (segment,)
            found = self._ids.get(path)
            if found is None:
                found = self._add(path, pid)
            self._child[key] = found
        return found

    def intern(self, path: Path) -> int:
        """The id of ``path`` (its prefixes are added too)."""
        found = self._ids.get(path)
        if found is None:
            found = self._add(path, self.intern(path[:-1]))
        return found

    def _add(self, path: Path, parent: int) -> int:
        k = self._ids[path] = len(self.paths)
        self.paths.append(path)
        self.parent.append(parent)
        return k
