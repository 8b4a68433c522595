"""Recompute cheap nodes the optimizer shared across groups, once per group that reads them.

torch.onnx's optimizer (CSE) merges equal computations: with dynamic shapes, block ``h.1``
reads a shape or mask value computed inside block ``h.0``. Left alone, ``h.0`` would return
an extra value and ``h.1`` take an extra input, so the blocks would no longer share one
function. So: when a node's value leaves its group for a group that is not inside it, and the
node can be recomputed by at most ``LIMIT`` nodes that read no weights, hold no subgraphs and
are deterministic, that *cone* is copied into the reading group. The cone stops at values made
outside the original's branch (the child of the groups' common ancestor that holds it): graph
inputs, initializers, nodes of the common ancestor or of a sibling group (``cos`` from a
rotary-embedding group). The reader already depends on those through the original, so reading
them directly adds no cycle. Only the nodes the group tree shows read in another group are
looked at (:attr:`Membership.leaving`). The copy goes at the same depth as the original
(``h.0/h.0.attn`` -> ``h.1/h.1.attn``). Originals left without readers are removed. A
heavier shared node stays a value passed between the two functions (valid, but the two groups
then get separate functions). A cone that is all its group computes is the group's result, not
a shared computation, and is never copied (a group of a few cheap ops would vanish).
"""

from __future__ import annotations

from typing import Mapping

import onnx_ir as ir

from rewrite.backends.onnx.outlining._boundary import detach, owners
from rewrite.backends.onnx.outlining._constants import is_weight
from rewrite.backends.onnx.outlining._membership import Membership
from rewrite._shared.onnx_ir_nodes import holds_graphs

LIMIT = 8
"""Most nodes copied for one shared value."""

NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"}


Path = tuple[int, ...]
"""Group ids from the top level's child down to a group (:meth:`Membership.path`)."""


def _within(path: Path, prefix: Path) -> bool:
    return path[: len(prefix)] == prefix


class _Recomputer:
    def __init__(self, graph: ir.Graph, members: Membership, weights: set[str],
                 owner: Mapping[ir.Node, ir.Node] | None = None) -> None:
        self.graph = graph
        self.members = members
        self.weights = weights
        self.owner: Mapping[ir.Node, ir.Node] = owners(graph) if owner is None else owner
        self.copies: dict[tuple[ir.Node, Path], ir.Node] = {}
        self.count = 0

    def where(self, node: ir.Node) -> Path:
        return self.members.path(self.members.group_of.get(node, 0))

    def cone(self, node: ir.Node, level: Path) -> list[ir.Node] | None:
        """Nodes to copy (producers first) to recompute ``node`` from values made outside its
        branch below ``level``."""
        branch = self.where(node)[: len(level) + 1]
        order: list[ir.Node] = []
        seen: set[ir.Node] = set()

        def visit(current: ir.Node) -> bool:
            if current in seen:
                return True
            if len(seen) >= LIMIT or not self._copyable(current):
                return False
            seen.add(current)
            for value in current.inputs:
                if value is None:
                    continue
                producer = value.producer()
                if producer is None:
                    if value.is_initializer() and is_weight(value, self.weights):
                        return False
                    continue
                if not _within(self.where(producer), branch):
                    continue  # made outside the original's branch: the reader can read it
                if not visit(producer):
                    return False
            order.append(current)
            return True

        return order if visit(node) else None

    def _copyable(self, node: ir.Node) -> bool:
        return (node.domain in ("", "com.microsoft")
                and node.op_type not in NONDETERMINISTIC
                and node.graph is self.graph and node in self.members.group_of
                and not holds_graphs(node))

    def copy(self, node: ir.Node, target: Path, before: ir.Node, rank: int) -> ir.Node:
        """A copy of ``node`` in group ``target``, reading earlier copies where made."""
        key = (node, target)
        made = self.copies.get(key)
        if made is not None:
            return made
        inputs = []
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            replaced = self.copies.get((producer, target)) if producer is not None else None
            inputs.append(value if replaced is None else replaced.outputs[value.index()])
        outputs = [ir.Value(type=v.type, shape=v.shape) for v in node.outputs]
        attrs = [ir.Attr(a.name, a.type, a.value, a.ref_attr_name)
                 for a in node.attributes.values()]
        props = dict(node.metadata_props)
        props["pkg.rewrite.recomputed_from"] = node.name or ""
        clone = ir.Node(node.domain, node.op_type, inputs, attrs, overload=node.overload,
                        outputs=outputs, version=node.version, metadata_props=props)
        self.graph.insert_before(before, clone)
        position = self.members.position[before]
        self.members.add(clone, target[-1] if target else 0, (position[0], -1, rank))
        self.copies[key] = clone
        self.count += 1
        return clone

    def run(self) -> int:
        group_of = self.members.group_of
        for node in list(self.members.leaving):
            if node.graph is not self.graph or node not in group_of:
                continue
            group = group_of[node]
            home = self.members.path(group)
            if not home:
                continue
            for value in node.outputs:
                for use in value.uses():
                    if group_of.get(self.owner.get(use.node, use.node)) == group:
                        continue  # read in its own group (the common case)
                    self._maybe_recompute(node, home, value, use)
        return self.count

    def _maybe_recompute(self, node: ir.Node, home: Path, value: ir.Value, use: ir.Usage) -> None:
        reader = self.owner.get(use.node, use.node)
        there = self.where(reader)
        if _within(there, home):
            return
        level = home[: next((i for i, (a, b) in enumerate(zip(home, there)) if a != b),
                            min(len(home), len(there)))]
        target = there[: len(home)]
        cone = self.cone(node, level)
        if cone is None or self._is_whole_group(cone, node):
            return
        for rank, original in enumerate(cone):
            self.copy(original, target, reader, rank)
        clone = self.copies[(node, target)]
        use.node.replace_input_with(use.idx, clone.outputs[value.index()])
        self._drop_if_dead(cone)

    def _is_whole_group(self, cone: list[ir.Node], node: ir.Node) -> bool:
        """The cone is all its group computes (a small group of cheap ops, like a flatten):
        the value is the group's result, not a computation shared by accident."""
        members = self.members.of(self.members.group_of[node])
        return len(members) <= len(cone) and set(members) <= set(cone)

    def _drop_if_dead(self, cone: list[ir.Node]) -> None:
        for original in reversed(cone):
            if original.graph is not self.graph:
                continue
            if any(v.uses() or v.is_graph_output() for v in original.outputs):
                continue
            detach(original)
            self.graph.remove(original)
            self.members.discard(original)


def recompute_shared(graph: ir.Graph, members: Membership, weights: set[str],
                     owner: Mapping[ir.Node, ir.Node] | None = None) -> int:
    """Apply the policy in the module docstring; returns the number of nodes copied.
    ``owner`` is ``owners(graph)`` when the caller has it (copies hold no subgraphs, so it
    stays valid)."""
    return _Recomputer(graph, members, weights, owner).run()
