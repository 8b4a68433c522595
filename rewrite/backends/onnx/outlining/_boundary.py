"""Where a set of nodes meets the rest of the graph: its inputs, outputs and users.

Every set handled here lives in the main graph; nodes inside subgraphs (``If``/``Loop``
bodies) count as part of the main-graph node that owns them.
"""

from __future__ import annotations

from typing import Collection, Mapping

import onnx_ir as ir

from rewrite._shared.onnx_ir_nodes import graph_kinds, holds_graphs, inner_nodes, subgraph_captures
from rewrite._private.onnx_ir_attrs import attribute_dict


def owners(graph: ir.Graph) -> dict[ir.Node, ir.Node]:
    """For every node inside a subgraph, the main-graph node that holds it."""
    owner: dict[ir.Node, ir.Node] = {}
    kinds = graph_kinds()
    for node in graph:
        for attr in attribute_dict(node).values():  # holds_graphs, inlined
            if attr.type in kinds:
                owner.update(dict.fromkeys(inner_nodes(node), node))
                break
    return owner


def boundary(
    members: list[ir.Node], member_set: Collection[ir.Node], owner: Mapping[ir.Node, ir.Node]
) -> tuple[list[ir.Value], list[ir.Value]]:
    """``(inputs, outputs)`` of ``members``: values read from outside in order of first use,
    and values read outside (or graph outputs) in member order."""
    inputs: dict[ir.Value, None] = {}
    outputs: list[ir.Value] = []
    for node in members:
        for value in node.inputs:
            if value is not None and value.producer() not in member_set:
                inputs[value] = None
        if owner and holds_graphs(node):  # no owners: no subgraph holds a node to read with
            for value in subgraph_captures(node):
                if value.producer() not in member_set:
                    inputs[value] = None
    for node in members:
        for value in node.outputs:
            if value.is_graph_output():
                outputs.append(value)
                continue
            for use in value.uses():
                user = use.node
                if (owner.get(user, user) if owner else user) not in member_set:
                    outputs.append(value)
                    break
    return list(inputs), outputs


def rewire(
    graph: ir.Graph,
    old: list[ir.Value],
    new: list[ir.Value],
    member_set: Collection[ir.Node],
    owner: Mapping[ir.Node, ir.Node],
) -> None:
    """Make every reader outside ``member_set`` (and the graph outputs) read ``new`` for ``old``."""
    for before, after in zip(old, new):
        for use in before.uses():
            if owner.get(use.node, use.node) not in member_set:
                use.node.replace_input_with(use.idx, after)
        if before.is_graph_output():
            for i, value in enumerate(graph.outputs):
                if value is before:
                    graph.outputs[i] = after


def substitute(node: ir.Node, mapping: Mapping[ir.Value, ir.Value]) -> None:
    """Replace the inputs of ``node`` and of its inner nodes that ``mapping`` has."""
    for i, value in enumerate(node.inputs):
        if value is not None and value in mapping:
            node.replace_input_with(i, mapping[value])
    if holds_graphs(node):
        for inner in inner_nodes(node):
            for i, value in enumerate(inner.inputs):
                if value is not None and value in mapping:
                    inner.replace_input_with(i, mapping[value])


def detach(node: ir.Node) -> None:
    """Drop every input of ``node`` and its inner nodes, so no value lists them as users."""
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    if holds_graphs(node):
        for inner in inner_nodes(node):
            for i in range(len(inner.inputs)):
                inner.replace_input_with(i, None)
