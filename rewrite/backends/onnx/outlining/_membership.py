"""Which main-graph ONNX nodes each group holds directly, and their canonical order.

Groups are the tree's integer ids (:attr:`GroupTree.table`; 0: the top level).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

import numpy as np
import onnx_ir as ir
from attrs import define, field

from rewrite.grouping import Group, GroupTree

Position = tuple[int, int, int]


@define
class Membership:
    """Direct ONNX members per group id (0 = top level), with an order key per node.

    Starts as the group tree says; ``outlining._recompute`` adds recomputed copies and
    drops dead nodes."""

    parent: list[int] = field(factory=lambda: [-1])
    """Per group id, its parent's (the tree's :attr:`rewrite.grouping.tree.GroupTable.parent`)."""
    nodes: dict[int, list[ir.Node]] = field(factory=lambda: defaultdict(list))
    group_of: dict[ir.Node, int] = field(factory=dict)
    position: dict[ir.Node, Position] = field(factory=dict)
    leaving: list[ir.Node] = field(factory=list)
    """Nodes with a value read by a node of another group (or of the top level), in graph
    order, as the tree's edges say; empty for nodes at the top level."""
    _paths: dict[int, tuple[int, ...]] = field(factory=dict, init=False, repr=False)

    @classmethod
    def from_tree(cls, tree: GroupTree, graph: ir.Graph, rows: list[ir.Node] | None = None,
                  homes: Mapping[ir.Node, int] | None = None) -> "Membership":
        """Members as ``tree`` says; ``graph`` is the main graph the tree was built on, or a
        clone of it (its nodes, in order, are the tree's non-I/O nodes). A tree read with
        stand-ins (``frontends.onnx.Expansion``) gives ``rows`` (per non-I/O node of the tree,
        its main-graph node) and ``homes``: each standing node's group, where it is the one
        member for all its rows (at the position of its first row)."""
        nodes = list(graph) if rows is None else rows
        columns = tree.graph.columns
        is_io = columns.is_io
        indices = np.flatnonzero(~is_io)
        if len(indices) != len(nodes):
            raise ValueError(f"the group tree has {len(indices)} ONNX nodes, the graph "
                             f"{len(nodes)}: it was built on another graph")
        slot = np.full(len(is_io), -1, dtype=np.int64)  # tree node index -> index in nodes
        slot[indices] = np.arange(len(nodes))
        number = np.where(is_io, 0, tree.group_of)  # tree node index -> group (0: top)
        positions = [(i, 0, 0) for i in indices.tolist()]
        # a standing node's position: its first row's (the reversed pairs keep the first)
        position = dict(zip(nodes, positions)) if rows is None else \
            dict(zip(reversed(nodes), reversed(positions)))
        members = cls(parent=tree.table.parent.tolist(), group_of=dict.fromkeys(nodes, 0),
                      position=position)
        for group in tree.groups():
            if not group.nodes:
                continue
            direct = [nodes[j] for j in slot[np.asarray(group.nodes, dtype=np.int64)].tolist()]
            members.nodes[group.index] = direct
            members.group_of.update(dict.fromkeys(direct, group.index))
        top = slot[(number == 0) & ~is_io].tolist()
        if top:
            members.nodes[0] = [nodes[j] for j in top]
        producer, consumer = columns.edges()
        home = number[producer]
        crossing = (home != 0) & (home != number[consumer]) & ~is_io[consumer]
        members.leaving = list(dict.fromkeys(
            nodes[j] for j in slot[np.unique(producer[crossing])].tolist()))
        if homes:
            members._gather(homes)
        return members

    def _gather(self, homes: Mapping[ir.Node, int]) -> None:
        """Each standing node the one member of its home group (see :meth:`from_tree`)."""
        for group, direct in list(self.nodes.items()):
            if any(node in homes for node in direct):
                self.nodes[group] = [node for node in direct if node not in homes]
        for node, group in homes.items():
            self.nodes[group].append(node)
            self.group_of[node] = group
        for group in {homes[node] for node in homes}:
            self.nodes[group].sort(key=self.position.__getitem__)

    def path(self, group: int) -> tuple[int, ...]:
        """The groups from the top level's child down to ``group`` (``()`` for the top)."""
        found = self._paths.get(group)
        if found is None:
            up = self.parent[group]
            found = self._paths[group] = self.path(up) + (group,) if up >= 0 else ()
        return found

    def add(self, node: ir.Node, group: int, position: Position) -> None:
        self.nodes[group].append(node)
        self.group_of[node] = group
        self.position[node] = position

    def discard(self, node: ir.Node) -> None:
        group = self.group_of.pop(node)
        self.nodes[group].remove(node)
        del self.position[node]

    def only_member(self, group: Group, node: ir.Node) -> bool:
        """``node`` is the one node of ``group`` and its descendants
        (``outlining._recompute`` added none)."""
        return self.of(group.index) == [node] and not any(
            self.of(inner.index) for inner in group.walk() if inner is not group)

    def of(self, group: int) -> list[ir.Node]:
        return self.nodes.get(group, [])
