"""Which main-graph ONNX nodes each group holds directly, and their canonical order."""

from __future__ import annotations

from collections import defaultdict

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
    def from_tree(cls, tree: GroupTree) -> "Membership":
        members = cls()
        for node in tree.graph.nodes:
            if node.op == "onnx":
                members.add(node.source, tree.owner[node.index], (node.index, 0, 0))
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
