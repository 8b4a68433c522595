"""How a call site is rewritten: a group's members replaced by one call node.

The call is inserted before the group's first member, named after the group, with the
group's call metadata (``outlining._naming``); readers outside switch to its outputs
(``outlining._boundary.rewire``); members whose function already exists are removed (those of
a new function move into its body, see ``outlining._functions``).
"""

from __future__ import annotations

import onnx_ir as ir

from rewrite.backends.onnx.outlining import _naming as naming
from rewrite.backends.onnx.outlining._boundary import detach, rewire
from rewrite.grouping import Group


class CallSites:
    """The main graph's call sites: made, rewired, and what replaced what."""

    def __init__(self, graph: ir.Graph, owner: dict[ir.Node, ir.Node],
                 position: dict[ir.Node, tuple], root_class: str | None,
                 track: bool) -> None:
        self.graph = graph
        self.owner = owner
        """Each node inside a subgraph -> the main-graph node holding it."""
        self.holders = set(owner.values())
        self.position = position
        """Each main-graph node (members, calls made) -> its position in the graph's order."""
        self.root_class = root_class
        self.track = track
        """Remember replaced values (only stand-ins need them, see :meth:`current`)."""
        self.renamed: dict[ir.Value, ir.Value] = {}
        """Values outlining replaced (outputs of members) -> their replacements."""

    def insert(self, group: Group, chain: list[Group], name: str, args: list[ir.Value],
               outputs: list[ir.Value], members: list[ir.Node]) -> ir.Node:
        """A call of ``group.domain::name`` before ``members[0]`` (not yet rewired)."""
        results = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]
        call = ir.Node(
            group.domain, name, args, outputs=results, name=group.id,
            metadata_props=naming.call_metadata(chain, self.root_class),
        )
        self.graph.insert_before(members[0], call)
        return call

    def rewire(self, old: list[ir.Value], new: list[ir.Value], member_set: set[ir.Node]
               ) -> None:
        """:func:`_boundary.rewire`, remembering the replacements (see :meth:`current`)."""
        if self.track:
            self.renamed.update(zip(old, new))
        rewire(self.graph, old, new, member_set, self.owner)

    def current(self, value: ir.Value) -> ir.Value:
        """The value that now stands for ``value`` (after outlining replaced it)."""
        while value in self.renamed:
            value = self.renamed[value]
        return value

    def replace(self, group: Group, chain: list[Group], function: ir.Function,
                args: list[ir.Value], outputs: list[ir.Value], members: list[ir.Node],
                member_set: set[ir.Node], first: tuple) -> ir.Node:
        """Replace ``members`` (in ``function``'s order) by a call of ``function`` placed at
        ``first`` (the position of the first member)."""
        call = self.insert(group, chain, function.name, args, outputs, members)
        self.rewire(outputs, list(call.outputs), member_set)
        self.drop(members, member_set)
        self.position[call] = first
        return call

    def drop(self, members: list[ir.Node], member_set: set[ir.Node]) -> None:
        """Remove the members of a group whose function exists. Only inputs made outside
        need detaching: values made inside leave with their producers (readers outside
        were rewired to the call)."""
        for node in members:
            if node in self.holders:  # its subgraphs hold nodes
                detach(node)
                continue
            for i, value in enumerate(node.inputs):
                if value is not None and value.producer() not in member_set:
                    node.replace_input_with(i, None)
        self.graph.remove(members)
