"""The group tree as integer-indexed arrays over FX nodes (what the passes below walk).

Read from the tree's :class:`~rewrite.grouping.tree.GroupTable` and records. Its own ids
(``gid``) number the groups it keeps in pre-order, the root is 0: groups whose subtree holds
no computation (only attribute reads) are dropped, they would be empty submodules.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from attrs import field, frozen

from rewrite.backends.fx.source import FxSource
from rewrite.errors import InputError
from rewrite.grouping import Group, GroupTree


@frozen
class Hierarchy:
    """Groups by gid, their nesting, and which group computes each node."""

    groups: tuple[Group, ...] = field(repr=False)
    parent: tuple[int, ...]
    """Parent gid (-1 for the root)."""
    depth: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    prefix: tuple[str, ...]
    """Module path of the call for module groups; ``""`` for the root and split components."""
    nodes: tuple[torch.fx.Node, ...] = field(repr=False)
    """All FX nodes in topological order (``position`` indexes it)."""
    position: Mapping[torch.fx.Node, int] = field(repr=False)
    owner: Mapping[torch.fx.Node, int] = field(repr=False)
    """For every computation node, the gid of the innermost group that holds it."""
    direct: tuple[tuple[torch.fx.Node, ...], ...] = field(repr=False)
    """Computation nodes held directly by each group, in topological order."""
    first: tuple[int, ...]
    """Position of the first computation node in each group's subtree."""
    leaf: tuple[torch.fx.Node | None, ...] = field(repr=False)
    """The ``call_module`` node when a group is exactly one call of a leaf module."""

    def __len__(self) -> int:
        return len(self.groups)

    def subtree_nodes(self, gid: int):
        """Computation nodes of a group and its descendants (direct ones first)."""
        yield from self.direct[gid]
        for child in self.children[gid]:
            yield from self.subtree_nodes(child)


def is_computation(node: torch.fx.Node, source: FxSource) -> bool:
    return node.op not in ("placeholder", "output") and node not in source.attributes


def _kept_groups(tree: GroupTree, computes: list[bool]) -> list:
    """The groups with computation somewhere below them, in pre-order (the root first)."""
    up = tree.table.parent.tolist()  # parents have smaller ids
    busy = [False] * len(up)
    busy[0] = True
    for k in np.unique(tree.group_of[np.asarray(computes, dtype=bool)]).tolist():
        while not busy[k]:
            busy[k] = True
            k = up[k]
    return [g for g in tree.root.walk() if busy[g.index]]


def build_hierarchy(tree: GroupTree, source: FxSource) -> Hierarchy:
    """Index ``tree`` over the FX nodes of ``source`` (IR node i is FX node i)."""
    nodes = tuple(source.graph.nodes)
    ir = tree.graph.nodes
    probes = {0, len(nodes) // 2, len(nodes) - 1} if nodes else set()
    if len(nodes) != len(ir) or any(ir[i].source is not nodes[i] for i in probes):
        raise InputError(
            "the model's graph changed after rewrite.apply() (torch.export.unflatten, for one, "
            "removes dead nodes in place); call rewrite.apply() again"
        )
    position = {node: i for i, node in enumerate(nodes)}
    computes = [is_computation(node, source) for node in nodes]
    kept = _kept_groups(tree, computes)
    gid_of = {g.index: i for i, g in enumerate(kept)}
    parent = [-1] * len(kept)
    depth = [0] * len(kept)
    children: list[list[int]] = [[] for _ in kept]
    for gid, group in enumerate(kept):
        for child in group.children:
            cid = gid_of.get(child.index)
            if cid is not None:
                parent[cid] = gid
                depth[cid] = depth[gid] + 1
                children[gid].append(cid)

    owner: dict[torch.fx.Node, int] = {}
    direct: list[list[torch.fx.Node]] = [[] for _ in kept]
    first = [len(nodes)] * len(kept)
    group_of = tree.group_of.tolist()
    for i, node in enumerate(nodes):
        if not computes[i]:
            continue
        gid = gid_of[group_of[i]]
        owner[node] = gid
        direct[gid].append(node)
        g = gid
        while g >= 0 and first[g] > i:
            first[g] = i
            g = parent[g]

    prefix = tuple(g.call.path if g.kind == "module" and g.call is not None else "" for g in kept)
    leaf = tuple(
        _leaf_call(direct[gid], children[gid], prefix[gid]) for gid in range(len(kept))
    )
    return Hierarchy(
        groups=tuple(kept),
        parent=tuple(parent),
        depth=tuple(depth),
        children=tuple(tuple(c) for c in children),
        prefix=prefix,
        nodes=nodes,
        position=position,
        owner=owner,
        direct=tuple(tuple(d) for d in direct),
        first=tuple(first),
        leaf=leaf,
    )


def _leaf_call(direct: list[torch.fx.Node], children: list[int],
               prefix: str) -> torch.fx.Node | None:
    """A group that is one ``call_module`` of its own module is that module, not a new one."""
    if prefix and not children and len(direct) == 1:
        node = direct[0]
        if node.op == "call_module" and node.target == prefix:
            return node
    return None
