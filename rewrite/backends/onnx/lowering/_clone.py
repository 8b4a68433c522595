"""A copy of a model to outline, leaving the caller's model as it was.

Outlining changes the main graph (nodes move into functions, values are rewired, unused
initializers go), so its nodes and values are new objects; what it never changes is shared,
as ``Model.clone`` shares it: tensors, and attributes that hold no graph. The copy equals
``Model.clone()`` (same nodes in the same order, same names, types, shapes, metadata) at
about 80% of its cost (values built complete, not set field by field; no empty metadata
made on the input's nodes and values). A main graph with subgraphs (``If``/``Loop``) or
device configurations is copied by ``Model.clone``. Most of what copying cost was the
garbage collector: callers pause it.
"""

from __future__ import annotations

import onnx_ir as ir

from rewrite._onnx_ir import attribute_values, holds_graphs

Owner = ir.Value | ir.Node | ir.Graph
"""What carries ``metadata_props`` and ``meta``."""


def copy_model(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose main graph is new and shares tensors with the input."""
    graph = model.graph
    if any(node.device_configurations or holds_graphs(node) for node in graph):
        return model.clone()
    values: dict[ir.Value, ir.Value] = {}
    inputs = [_value(v, values) for v in graph.inputs]
    initializers = [values[v] if v in values else _value(v, values)
                    for v in graph.initializers.values()]
    nodes = [_node(node, values) for node in graph]
    new_graph = ir.Graph(inputs, [values[v] for v in graph.outputs], nodes=nodes,
                         initializers=initializers, doc_string=graph.doc_string,
                         opset_imports=graph.opset_imports.copy(), name=graph.name)
    if props := _props(graph):
        new_graph.metadata_props.update(props)
    _copy_meta(graph, new_graph)
    return ir.Model(
        new_graph, ir_version=model.ir_version, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version, doc_string=model.doc_string,
        functions=[f.clone() for f in model.functions.values()],
        metadata_props=dict(model.metadata_props),
        device_configurations=model.device_configurations,
    )


def _value(value: ir.Value, values: dict[ir.Value, ir.Value]) -> ir.Value:
    """A new value like ``value`` (its tensor shared), recorded in ``values``."""
    shape = value.shape
    new = values[value] = ir.Value(
        name=value.name, type=value.type, shape=shape.copy() if shape is not None else None,
        doc_string=value.doc_string, const_value=value.const_value,
        metadata_props=_props(value),
    )
    _copy_meta(value, new)
    return new


def _node(node: ir.Node, values: dict[ir.Value, ir.Value]) -> ir.Node:
    """A new node like ``node`` reading the copies of its inputs (attributes shared)."""
    new = ir.Node(
        node.domain, node.op_type,
        [values[v] if v is not None else None for v in node.inputs],
        tuple(attribute_values(node)), overload=node.overload,
        outputs=[_value(v, values) for v in node.outputs], version=node.version,
        name=node.name, doc_string=node.doc_string, metadata_props=_props(node),
    )
    _copy_meta(node, new)
    return new


def _own(owner: Owner, slot: str, public: str):
    """``owner.<public>`` without making an empty one on the input (the properties of
    ``onnx_ir`` create it on first read: an object per node and value)."""
    try:
        return getattr(owner, slot)
    except AttributeError:  # another onnx_ir layout: the property
        return getattr(owner, public)


def _props(owner: Owner) -> dict[str, str] | None:
    """A copy of ``owner.metadata_props``; None when empty."""
    props = _own(owner, "_metadata_props", "metadata_props")
    return dict(props) if props else None


def _copy_meta(old: Owner, new: Owner) -> None:
    """``new.meta`` as ``old.meta`` (values shared, invalidated keys kept invalid)."""
    meta = _own(old, "_metadata", "meta")
    if meta:
        new.meta.update(meta)
        for key in getattr(meta, "_invalid_keys", ()):
            new.meta.invalidate(key)
