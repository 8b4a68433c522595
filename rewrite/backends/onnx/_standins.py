"""Calls left as one node: each stands in for the nodes inlining it would give.

The per-body lowering (:mod:`lowering._perbody`) gets from torch.onnx one function per distinct body
and one call of it per grouped call. Only the first call of each body is inlined; every other
call stays one node (domain :data:`DOMAIN`, which onnx_ir's ``InlinePass`` skips) that *stands
in* for the nodes inlining it would give:

* grouping reads it as those nodes (an ``Expansion`` of the first call's inlined nodes, the
  :class:`Template`, with the facts of this call's own FX nodes): the ONNX tree, its sizes and
  warnings are those of the fully inlined graph;
* :func:`plan` checks that each stand-in's rows form a group subtree shaped like the first
  call's (same groups, kinds, names, domains, each row in the matching group) and gives the
  outliner a :class:`Reuse`: the stand-in's group becomes a call of the function the first
  call's group got, its arguments and outputs picked by position (:mod:`outlining`).

Anything else (rows that form no such subtree; a first-call function that reads a value that
is not one of the call's inputs or returns one that is not its output; an embedded constant
that differs; outputs used differently): a :class:`MustInline` names the calls to inline, and
the lowering runs again with them inlined, as every call used to be.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx_ir as ir
from attrs import field, frozen

from rewrite._shared.onnx_ir_nodes import holds_graphs, subgraph_captures
from rewrite.frontends.onnx.graph import Expansion, NodeFacts, expanded_rows
from rewrite.grouping import GroupTree

DOMAIN = "pkg.rewrite.standin"
"""Domain of a call left standing while lowering (no function has it: never inlined)."""


@frozen
class MustInline:
    """These calls cannot stand in: the lowering must run again with them inlined (see the
    module docstring). Returned, not raised, by the steps that find them."""

    calls: frozenset[int] = field(converter=frozenset)
    """Indices of the calls (in the per-body lowering's list of calls)."""
    reason: str


@frozen
class Template:
    """The first call of a body, inlined: what its stand-ins copy."""

    nodes: tuple[ir.Node, ...]
    """The inlined nodes, in graph order."""
    inputs: tuple[ir.Value | None, ...]
    """Per input of the call, the value its inlined nodes read (None: unread)."""
    outputs: tuple[ir.Value | None, ...]
    """Per output of the call, the inlined value that replaced it (None: unused)."""
    reads: tuple[tuple[int, ...], ...]
    """Per node, as :attr:`Expansion.reads`."""
    rows: tuple[int, ...]
    """Per output of the call, the node that makes it (-1: none)."""


def make_template(nodes: Sequence[ir.Node], inputs: Sequence[ir.Value | None],
                  outputs: Sequence[ir.Value | None]) -> Template | None:
    """The template of a call inlined as ``nodes``; None when its stand-ins could not copy
    it (a node, or a subgraph it holds, reads a value neither made inside nor an input, an
    output is not made inside, the inputs are not distinct)."""
    row = {node: r for r, node in enumerate(nodes)}
    position = {value: p for p, value in enumerate(inputs) if value is not None}
    if len(position) != sum(value is not None for value in inputs):
        return None
    reads = []
    for node in nodes:
        refs = []
        # a node holding subgraphs (a Scan) also reads what they capture, as the frontend
        # reads it (``frontends.onnx.graph``)
        read = dict.fromkeys([*node.inputs, *subgraph_captures(node)]) if holds_graphs(node) \
            else node.inputs
        for value in read:
            if value is None:
                continue
            producer = value.producer()
            if producer in row:
                refs.append(row[producer])
            elif value in position:
                refs.append(-1 - position[value])
            else:
                return None
        reads.append(tuple(refs))
    made = []
    for value in outputs:
        producer = value.producer() if value is not None else None
        if value is not None and producer not in row:
            return None
        made.append(row[producer] if producer is not None else -1)
    return Template(tuple(nodes), tuple(inputs), tuple(outputs), tuple(reads), tuple(made))


@frozen
class StandIn:
    """A call left standing: its node, call indices and the rows it stands for."""

    node: ir.Node
    call: int
    first_call: int
    """The call whose inlined nodes are the :class:`Template`."""
    expansion: Expansion


def stand_in(node: ir.Node, call: int, first_call: int, template: Template,
             facts: Sequence[NodeFacts]) -> StandIn:
    return StandIn(node, call, first_call, Expansion(tuple(facts), template.reads, template.rows))


@frozen
class Reuse:
    """A stand-in's group, to be outlined as a call of its first call's group's function."""

    node: ir.Node
    call: int
    first_group: int
    """Group id of the first call's group (in the ONNX tree)."""
    groups: Mapping[int, int]
    """Each group of the stand-in's subtree -> the matching group of the first call's."""
    template: Template


@frozen
class Plan:
    """What the outliner needs about stand-ins."""

    rows: list[ir.Node]
    """Per non-I/O node of the tree, its main-graph node (``frontends.onnx.expanded_rows``)."""
    reuses: Mapping[int, Reuse]
    """By the stand-in's group id."""

    @property
    def homes(self) -> dict[ir.Node, int]:
        return {reuse.node: group for group, reuse in self.reuses.items()}


def plan(tree: GroupTree, graph: ir.Graph, stand_ins: Mapping[ir.Node, StandIn],
         templates: Mapping[int, Template], group_ids: Sequence[str]) -> Plan | MustInline:
    """Match every stand-in's subtree with its first call's (see the module docstring);
    ``group_ids``: per call, its group's display id. The calls whose subtrees differ from
    their first call's: :class:`MustInline`."""
    rows = expanded_rows(list(graph), {n: s.expansion for n, s in stand_ins.items()})
    index = np.flatnonzero(~tree.graph.columns.is_io).tolist()
    row_of: dict[ir.Node, int] = {}
    for r, node in enumerate(rows):
        row_of.setdefault(node, r)
    by_id = {gid: k for k, gid in enumerate(tree.ids) if tree.records[k] is not None}
    failed: set[int] = set()
    reuses: dict[int, Reuse] = {}
    for node, standing in stand_ins.items():
        template = templates[standing.first_call]
        mine = [index[r] for r in range(row_of[node], row_of[node] + len(template.nodes))]
        theirs = [index[row_of[n]] for n in template.nodes]
        own = by_id.get(group_ids[standing.call])
        first = by_id.get(group_ids[standing.first_call])
        groups = (_match(tree, own, first, mine, theirs)
                  if own is not None and first is not None else None)
        if groups is None:
            failed.add(standing.call)
            continue
        reuses[own] = Reuse(node, standing.call, groups[own], groups, template)
    if failed:
        return MustInline(failed, "a call's groups differ from its first call's")
    return Plan(rows, reuses)


def _match(tree: GroupTree, own_index: int, first_index: int, mine: list[int],
           theirs: list[int]) -> dict[int, int] | None:
    """Groups of the subtree of group ``own_index``, which must hold exactly ``mine``, ->
    those of ``first_index``'s, which must hold ``theirs`` (row by row), when the two
    subtrees have one shape (``GroupTree.subtree_shape``); else None."""
    records = tree.records
    own, first = records[own_index], records[first_index]
    if own is None or first is None or own_index == first_index:
        return None
    if sorted(own.all_nodes()) != sorted(mine) or sorted(first.all_nodes()) != sorted(theirs):
        return None
    shape, first_shape = tree.subtree_shape(own_index, mine), tree.subtree_shape(first_index,
                                                                                 theirs)
    if shape != first_shape:
        return None
    return dict(zip(shape.ids, first_shape.ids))
