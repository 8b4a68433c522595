"""Which main-graph ONNX nodes each group holds directly, and their canonical order."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx_ir as ir
from attrs import define, field

from rewrite.grouping import GroupTree

Position = tuple[int, int, int]


@define
class Membership:
    """Direct ONNX members per group id (``""`` = top level), with an order key per node.

    Starts as the group tree says; ``remat`` adds recomputed copies and drops dead nodes."""

    nodes: dict[str, list[ir.Node]] = field(factory=lambda: defaultdict(list))
    group_of: dict[ir.Node, str] = field(factory=dict)
    position: dict[ir.Node, Position] = field(factory=dict)

    @classmethod
    def from_tree(cls, tree: GroupTree, graph: ir.Graph) -> "Membership":
        """Members as ``tree`` says; ``graph`` is the main graph the tree was built on, or a
        clone of it (its nodes, in order, are the tree's non-I/O nodes)."""
        nodes = list(graph)
        indices = np.flatnonzero(~tree.graph.columns.is_io).tolist()
        if len(indices) != len(nodes):
            raise ValueError(f"the group tree has {len(indices)} ONNX nodes, the graph "
                             f"{len(nodes)}: it was built on another graph")
        owner = tree.owner
        groups = [owner[i] for i in indices]
        members = cls(group_of=dict(zip(nodes, groups)),
                      position=dict(zip(nodes, [(i, 0, 0) for i in indices])))
        by_group = members.nodes
        for node, group in zip(nodes, groups):
            by_group[group].append(node)
        return members

    def add(self, node: ir.Node, group: str, position: Position) -> None:
        self.nodes[group].append(node)
        self.group_of[node] = group
        self.position[node] = position

    def discard(self, node: ir.Node) -> None:
        group = self.group_of.pop(node)
        self.nodes[group].remove(node)
        del self.position[node]

    def of(self, group: str) -> list[ir.Node]:
        return self.nodes.get(group, [])
