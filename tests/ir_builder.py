"""Hand-made IR graphs for core tests: a few nodes with chosen stacks, targets and tags.

The graphs carry no columns, so grouping derives them (``columns_of``), as it does for a
frontend that only fills the nodes.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from rewrite.ir import Graph, ModuleCall, Node
from rewrite.ir.columns import CallColumns
from rewrite.ir.stacks import StackTreeBuilder


def call_columns_of(calls: Sequence[ModuleCall]) -> CallColumns:
    """Call columns derived from the calls alone (what a frontend's columns must equal)."""
    return StackTreeBuilder(calls).call_columns()


def call(path: str, cls: str = "pkg.mod.Block", index: int = 0) -> ModuleCall:
    return ModuleCall(path, cls, index)


class GraphBuilder:
    """``b.op("mm", "aten.mm.default", [x], stack=(c1, c2), tags={"stage": "a"})``."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def _add(self, name: str, op: str, target: str, inputs: Iterable[int], stack,
             tags: Mapping[str, str] | None, is_io: bool) -> int:
        index = len(self.nodes)
        self.nodes.append(Node(index, name, op, target, tuple(dict.fromkeys(inputs)), stack,
                               dict(tags or {}), is_io))
        return index

    def input(self, name: str = "x") -> int:
        return self._add(name, "placeholder", name, (), (), None, True)

    def op(self, name: str, target: str = "aten.add.Tensor", inputs: Iterable[int] = (),
           stack=(), tags: Mapping[str, str] | None = None) -> int:
        return self._add(name, "call_function", target, inputs, stack, tags, False)

    def output(self, inputs: Iterable[int]) -> int:
        return self._add("output", "output", "output", inputs, (), None, True)

    def graph(self, root_class: str = "pkg.Model") -> Graph:
        calls: dict[ModuleCall, None] = {}
        for node in self.nodes:
            for c in node.stack or ():
                calls.setdefault(c, None)
        return Graph(tuple(self.nodes), tuple(calls), "fx", root_class)


def chain(stacks: list, targets: list[str] | None = None, tags: list | None = None) -> Graph:
    """A straight line of nodes, one per stack: input -> n0 -> n1 -> ... -> output."""
    b = GraphBuilder()
    prev = b.input()
    for k, stack in enumerate(stacks):
        prev = b.op(f"n{k}", (targets or [])[k] if targets else "aten.add.Tensor", [prev],
                    stack, (tags or [None] * len(stacks))[k])
    b.output([prev])
    return b.graph()
