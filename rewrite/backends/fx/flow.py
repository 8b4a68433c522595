"""Data flow between groups: each submodule's inputs, outputs, attributes and body order.

One pass over the edges of the flat graph. An edge ``p -> n`` whose ends lie in different
groups makes ``p`` an output of every group from ``p``'s up to (not including) the lowest
common ancestor, an input of every group from ``n``'s up to it, and an ordering constraint
between the two items (child group or node) of the common ancestor's body. An attribute read
is materialized (``get_attr``) in the innermost enclosing group that may hold it (see
:mod:`layout`) and passed down as an input from there.

Inputs are ordered by first use, outputs by position in the flat graph. Bodies keep the
original order of their first nodes, moving an item later only when it must wait for another
(the grouping already checked that no cycle can arise).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Union

import torch
from attrs import field, frozen

from rewrite.backends.fx.hierarchy import Hierarchy
from rewrite.backends.fx.layout import Layout
from rewrite.backends.fx.source import FxSource

Item = Union[torch.fx.Node, int]
"""An element of a group's body: one of its own nodes, or a child group's gid."""


@frozen
class Flow:
    inputs: tuple[tuple[torch.fx.Node, ...], ...] = field(repr=False)
    outputs: tuple[tuple[torch.fx.Node, ...], ...] = field(repr=False)
    attributes: tuple[tuple[torch.fx.Node, ...], ...] = field(repr=False)
    """Attribute nodes each group reads with ``get_attr``, in order of first use."""
    body: tuple[tuple[Item, ...], ...] = field(repr=False)


def plan_flow(h: Hierarchy, layout: Layout, source: FxSource) -> Flow:
    n = len(h)
    inputs: list[dict[torch.fx.Node, None]] = [{} for _ in range(n)]
    outputs: list[set[torch.fx.Node]] = [set() for _ in range(n)]
    attrs: list[dict[torch.fx.Node, None]] = [{} for _ in range(n)]
    deps: list[dict[Item, set[Item]]] = [defaultdict(set) for _ in range(n)]
    parent, depth, owner = h.parent, h.depth, h.owner
    attributes = source.attributes
    owns: dict[tuple[int, str], bool] = {}

    for node in h.nodes:
        if node.op == "placeholder" or node in attributes:
            continue
        gn = 0 if node.op == "output" else owner[node]
        for p in node.all_input_nodes:
            attribute = attributes.get(p)
            if attribute is not None:
                g = gn
                while True:
                    key = (g, attribute.fqn)
                    mine = owns.get(key)
                    if mine is None:
                        mine = owns[key] = g == 0 or layout.owns(h, g, attribute.fqn)
                    if mine:
                        break
                    inputs[g][p] = None
                    g = parent[g]
                attrs[g][p] = None
                continue
            gp = 0 if p.op == "placeholder" else owner[p]
            a, b = gn, gp
            item_n: Item = node
            item_p: Item = p
            while depth[a] > depth[b]:
                inputs[a][p] = None
                item_n, a = a, parent[a]
            while depth[b] > depth[a]:
                outputs[b].add(p)
                item_p, b = b, parent[b]
            while a != b:
                inputs[a][p] = None
                outputs[b].add(p)
                item_n, a = a, parent[a]
                item_p, b = b, parent[b]
            if node.op != "output" and p.op != "placeholder" and item_n != item_p:
                deps[a][item_n].add(item_p)

    position = h.position
    body = tuple(_order(h, gid, deps[gid]) for gid in range(n))
    return Flow(
        inputs=tuple(tuple(d) for d in inputs),
        outputs=tuple(tuple(sorted(s, key=position.__getitem__)) for s in outputs),
        attributes=tuple(tuple(d) for d in attrs),
        body=body,
    )


def _order(h: Hierarchy, gid: int, deps: dict[Item, set[Item]]) -> tuple[Item, ...]:
    """The group's items in topological order, earliest first position first (Kahn)."""
    position, first = h.position, h.first
    items: list[Item] = [*h.direct[gid], *h.children[gid]]
    key = {item: (position[item] if isinstance(item, torch.fx.Node) else first[item])
           for item in items}
    users: dict[Item, list[Item]] = defaultdict(list)
    waiting: dict[Item, int] = {}
    for item in items:
        before = deps.get(item, ())
        waiting[item] = len(before)
        for d in before:
            users[d].append(item)
    ready = [(key[item], i) for i, item in enumerate(items) if not waiting[item]]
    heapq.heapify(ready)
    index = {item: i for i, item in enumerate(items)}
    out: list[Item] = []
    while ready:
        _, i = heapq.heappop(ready)
        item = items[i]
        out.append(item)
        for user in users.get(item, ()):
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (key[user], index[user]))
    if len(out) != len(items):  # pragma: no cover - grouping rejects cycles
        raise AssertionError(f"cycle between the parts of group {h.groups[gid].id!r}")
    return tuple(out)
