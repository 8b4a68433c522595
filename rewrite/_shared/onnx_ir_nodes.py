"""Small ``onnx_ir`` helpers that the ONNX frontend and the ONNX backend both use.

Reading attributes and subgraphs quickly: ``onnx_ir`` is imported on first use, not when
this module is (the frontend is imported by ``rewrite.apply`` for every model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

from rewrite._private.onnx_ir_attrs import attribute_dict

if TYPE_CHECKING:
    import onnx_ir as ir

_GRAPH_KINDS: tuple = ()


def graph_kinds() -> tuple:
    """The attribute types that hold graphs (``GRAPH``, ``GRAPHS``)."""
    global _GRAPH_KINDS
    if not _GRAPH_KINDS:
        import onnx_ir as ir

        _GRAPH_KINDS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
    return _GRAPH_KINDS


def attribute_values(node: "ir.Node") -> Iterable["ir.Attr"]:
    """``node.attributes.values()``, read from the underlying dict when there is one (the
    mapping view of ``onnx_ir``'s ``UserDict`` is several times slower; most callers are hot)."""
    return attribute_dict(node).values()


def holds_graphs(node: "ir.Node") -> bool:
    """Whether an attribute of ``node`` may hold a graph (cheap; most nodes hold none)."""
    attrs = attribute_dict(node)
    if not attrs:
        return False
    kinds = _GRAPH_KINDS or graph_kinds()
    for attr in attrs.values():
        if attr.type in kinds:
            return True
    return False


def graphs_of(node: "ir.Node") -> Iterator["ir.Graph"]:
    """The graphs held by ``node``'s attributes (an ``If``'s branches, a ``Loop``'s body; not
    recursive)."""
    import onnx_ir as ir

    for attr in attribute_values(node):
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def subgraph_captures(node: "ir.Node") -> Iterator["ir.Value"]:
    """Outer-scope values read by the nodes of ``node``'s subgraphs (recursively)."""
    for graph in graphs_of(node):
        yield from _graph_captures(graph)


def _graph_captures(graph: "ir.Graph") -> Iterator["ir.Value"]:
    local: set[int] = {id(v) for v in graph.inputs}
    local.update(id(v) for v in graph.initializers.values())
    for inner in graph:
        for value in inner.inputs:
            if value is not None and id(value) not in local:
                yield value
        for captured in subgraph_captures(inner):
            if id(captured) not in local:
                yield captured
        local.update(id(v) for v in inner.outputs)


def inner_nodes(node: "ir.Node") -> Iterator["ir.Node"]:
    """Every node inside ``node``'s subgraphs, recursively."""
    for graph in graphs_of(node):
        for inner in graph:
            yield inner
            yield from inner_nodes(inner)


def model_nodes(model: "ir.Model") -> Iterator["ir.Node"]:
    """Every node of ``model``: its main graph's and each local function's, with the nodes
    of their subgraphs (``Model.graphs()`` leaves the functions out)."""
    import onnx_ir as ir

    for graph in (model.graph, *model.functions.values()):
        yield from ir.traversal.RecursiveGraphIterator(graph)


def looks_like_weight(value: "ir.Value") -> bool:
    """An initializer of more than one element that is not of an index or mask type (int64,
    int32, bool: shapes, axes, positions): floats, and the integer types quantized weights
    use; or int32 data only ``DequantizeLinear`` reads (a QDQ quantizer's bias). For files
    that mark no weights (other producers'; quantizers' new initializers)."""
    import onnx_ir as ir

    tensor = value.const_value
    if tensor is None or tensor.size <= 1:
        return False
    if tensor.dtype == ir.DataType.INT32:
        uses = list(value.uses())
        return bool(uses) and all(use.node.op_type == "DequantizeLinear" and use.idx == 0
                                  for use in uses)
    return tensor.dtype not in (ir.DataType.INT64, ir.DataType.BOOL)
