"""Where an ONNX node of torch.onnx's translation came from: the node of the grouped program
(through the ``from_node`` provenance torch keeps across decompositions), and its facts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, TypeVar

import torch

from rewrite.frontends.onnx.graph import NodeFacts, onnx_target

if TYPE_CHECKING:
    import onnx_ir as ir

    from rewrite.ir import Node

T = TypeVar("T")
_OWN: Any = object()


def _sources(node: Any) -> tuple:
    """``from_node`` provenance of an FX node or of a provenance record."""
    if isinstance(node, torch.fx.Node):
        return tuple(node.meta.get("from_node") or ())
    return tuple(getattr(node, "from_node", None) or ())


def nearest(fx_node: torch.fx.Node, names: Mapping[str, T]) -> T | None:
    """What ``names`` maps the nearest ``from_node`` ancestor of ``fx_node`` to (the first,
    breadth first, whose name it has), else what it maps ``fx_node``'s own name to. An
    ancestor in ``fx_node``'s own graph (a pass over it, torch.onnx's type promotion, made
    ``fx_node`` from it) is not looked up: its name is of that graph, not of the one
    ``names`` names."""
    todo = list(_sources(fx_node))
    own = id(fx_node.graph)
    seen = 0
    while todo and seen < 64:
        node = todo.pop(0)
        seen += 1
        found = None if getattr(node, "graph_id", None) == own \
            else names.get(getattr(node, "name", None))
        if found is not None:
            return found
        todo.extend(_sources(node))
    return names.get(fx_node.name)


def node_facts(node: "Node | None", onnx_node: "ir.Node", target: Any = _OWN) -> NodeFacts:
    """The facts of ``node`` (an IR node of an FX graph) for ``onnx_node``, with ``target``
    if given; none known for no node or an I/O node: ``onnx_node``'s own op."""
    if node is None or node.is_io:
        return NodeFacts(None, onnx_target(onnx_node))
    return NodeFacts(node.stack, node.target if target is _OWN else target, node.tags)
