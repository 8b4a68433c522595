"""Inline a model's local functions into its main graph, in time linear in the nodes made.

The per-body lowering (:mod:`perbody`) gets from torch.onnx a main graph that calls one
function per distinct body (and torchlib's helper functions) and needs the flat graph
torch.onnx.export would have written. onnx_ir's ``InlinePass`` (which onnxscript's
``convert_version`` runs first) does this, but it makes names unique by trying ``name_2``,
``name_3``... in turn for every cloned node and value: with 48 calls of one body, a name is
tried ~1,000 times (measured: 0.5 s of CPU on the 48-block GPT-2, 10x the time on 12 blocks).

This inliner does what ``InlinePass`` does, with the same names: call sites in graph order,
the nodes of a body cloned in order, each named with the first free ``name``, ``name_2``,
``name_3``... (the next suffix to try is remembered per name: names are only ever added, so
the result is the one the pass gives), nested calls (a helper called inside a body) inlined
where they are reached; a cloned node's metadata is the call's overlaid with its own; function
attributes referenced by a body's nodes resolved from the call (or the function's default);
the call's output values are replaced by the body's, keeping their names, types and shapes.
"""

from __future__ import annotations

import onnx_ir as ir


class _Names:
    """First free ``name``, ``name_2``, ``name_3``... (as onnx_ir's inliner), in O(1)."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.next: dict[str, int] = {}

    def unique(self, name: str) -> str:
        candidate = name
        i = self.next.get(name, 1)
        if i > 1:
            candidate = f"{name}_{i}"
        while candidate in self.used:
            i += 1
            candidate = f"{name}_{i}"
        self.next[name] = i
        self.used.add(candidate)
        return candidate


def _attributes(node: ir.Node, bound: dict[str, ir.Attr]) -> list[ir.Attr]:
    out = []
    for key, attr in node.attributes.items():
        if not attr.is_ref():
            if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                raise ValueError(f"node {node.name} of a function has a graph attribute")
            out.append(attr)
            continue
        value = bound.get(attr.ref_attr_name)
        if value is None:  # an optional attribute the call does not give: dropped
            continue
        if value.is_ref():
            raise ValueError(f"attribute {key} of node {node.name} refers to another reference")
        out.append(ir.Attr(key, value.type, value.value, doc_string=value.doc_string))
    return out


def _instantiate(call: ir.Node, function: ir.Function, names: _Names,
                 values: _Names) -> tuple[list[ir.Node], list[ir.Value | None]]:
    """Copies of ``function``'s nodes for ``call``, named; and the values of its outputs."""
    bound = {attr.name: attr for attr in function.attributes.values()
             if attr.value is not None}
    bound.update(call.attributes)
    if len(call.inputs) > len(function.inputs):
        raise ValueError(f"call {call.name} of {function.name} has too many inputs")
    value_map: dict[ir.Value, ir.Value | None] = dict.fromkeys(function.inputs)
    value_map.update(zip(function.inputs, call.inputs))
    outer = call.metadata_props
    nodes = []
    for node in function:
        inputs = [value_map[v] if v is not None else None for v in node.inputs]
        copy = ir.Node(node.domain, node.op_type, inputs, _attributes(node, bound),
                       overload=node.overload, num_outputs=len(node.outputs),
                       version=node.version, name=names.unique(node.name or "node"),
                       doc_string=node.doc_string,
                       metadata_props={**outer, **node.metadata_props})
        for old, new in zip(node.outputs, copy.outputs):
            value_map[old] = new
            new.name = values.unique(old.name or "val")
            new.shape = old.shape.copy() if old.shape is not None else None
            new.type = old.type
            new.const_value = old.const_value
            if old.metadata_props:
                new.metadata_props.update(old.metadata_props)
        nodes.append(copy)
    return nodes, [value_map[o] for o in function.outputs]


def inline_functions(model: ir.Model) -> int:
    """Inline every call of a local function in ``model``'s main graph (nested calls too) and
    drop the functions; the number of calls inlined. The model's functions must not call
    each other in a cycle, and every function's opsets must agree with the model's."""
    functions = model.functions
    graph = model.graph
    names, values = _Names(), _Names()
    values.used.update(v.name for v in graph.inputs if v.name is not None)
    values.used.update(graph.initializers)
    for node in graph:
        if node.name:
            names.used.add(node.name)
        values.used.update(o.name for o in node.outputs if o.name is not None)
    inlined = 0

    def expand(call: ir.Node) -> None:  # depth first in graph order, as the pass names them
        nonlocal inlined
        nodes, outputs = _instantiate(call, functions[call.op_identifier()], names, values)
        ir.convenience.replace_nodes_and_values(
            graph, insertion_point=call, old_nodes=[call], new_nodes=nodes,
            old_values=call.outputs, new_values=outputs)
        inlined += 1
        for node in nodes:
            if node.op_identifier() in functions:
                expand(node)

    for call in [n for n in graph if n.op_identifier() in functions]:
        expand(call)
    functions.clear()
    return inlined
