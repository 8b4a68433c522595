"""Per-body lowering of an ExportedProgram: decompose and translate each distinct body once.

``torch.onnx.export`` decomposes the whole flat program (an AOT-autograd re-trace) and
translates it op by op: a 48-block model is decomposed and translated 48 times. Here:

1. The outermost groups whose bodies repeat become calls of one shared subgraph per distinct
   body: ``torch.ops.higher_order.invoke_subgraph(body, identifier, *inputs)``, weights and
   every value from outside passed as inputs (:func:`subgraphs.rebuild`). Bodies are the
   same when their nodes are (ops, arguments, scalars; the shapes and types of their inputs).
2. :mod:`torch_private` decomposes that program with torch.onnx's decomposition table
   (``make_fx``; the TracingContext's invoke_subgraph cache traces each body once) and
   translates it with torch.onnx's translator, which makes one ONNX function per subgraph.
3. Each body is converted to torch.onnx.export's opset once, then the functions are inlined
   back (:mod:`inline`) into the flat ONNX graph torch.onnx would have written, each inlined
   node marked with its call, its metadata (module paths in ``name_scopes`` / ``namespace``)
   that of its own call; a :data:`Resolver` gives each node the module stack, op target and
   tags of the node of the grouped program it came from (worked out once per body node).

The rest of the ``.pt2`` path (regroup, outline, optimize, merge) is unchanged, so the result
is what the flat path gives. Inlining and outlining again costs a pass over the ONNX nodes,
far less than decomposing every block.

:class:`Unsupported` says why a program cannot take this path (the caller falls back).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Mapping

import onnx_ir as ir
import torch
from attrs import frozen
from onnx_ir.passes import common as common_passes

from rewrite._gc import gc_paused
from rewrite.backends.onnx import torch_private
from rewrite.backends.onnx.inline import inline_functions
from rewrite.backends.onnx.subgraphs import Call, Unsupported, rebuild
from rewrite.frontends.onnx import (
    CLASS_HIERARCHY,
    NodeFacts,
    Resolver,
    onnx_target,
    read_scopes,
)
from rewrite.grouping import GroupTree

if TYPE_CHECKING:
    from rewrite.ir import Node

CALL_KEY = "rewrite.perbody.call"
"""ONNX node metadata while lowering: index of the call an inlined node belongs to."""
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
NAMESPACE = "namespace"
_SUBGRAPH_DOMAIN = "pkg.torch.__subgraph__"
_INLINED_HOPS = tuple(getattr(torch.ops.higher_order, name) for name in (
    "wrap_with_set_grad_enabled", "wrap_with_autocast")
    if hasattr(torch.ops.higher_order, name))
"""Higher-order ops that decomposition inlines (their bodies are plain ops), outside the
repeated bodies (a group holding one is not made a shared body)."""
__all__ = ["PerBody", "Unsupported", "check", "lower_per_body"]


@frozen
class PerBody:
    """The flat ONNX model and how to group its nodes."""

    model: ir.Model
    resolver: Resolver
    bodies: int
    """Distinct bodies decomposed and translated once each."""
    calls: int
    """Grouped calls that reused them."""


def check(program: torch.export.ExportedProgram) -> None:
    """Raise :class:`Unsupported` for programs this path does not handle."""
    reason = torch_private.available()
    if reason is not None:
        raise Unsupported(f"torch's private exporter APIs changed ({reason})")
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise Unsupported("the program mutates buffers or inputs")
    if getattr(signature, "backward_signature", None) is not None:
        raise Unsupported("the program is a joint forward/backward graph")
    for node in program.graph.nodes:
        if isinstance(node.target, torch._ops.HigherOrderOperator) \
                and node.target not in _INLINED_HOPS:
            raise Unsupported(f"the program has a higher-order op ({node.target.name()})")
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                and node.target._schema.is_mutable:
            raise Unsupported(f"the program has an in-place op ({node.target})")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            raise Unsupported("the program has dynamic shapes")


def _sources(node: Any) -> tuple:
    """``from_node`` provenance of an FX node or of a provenance record."""
    if isinstance(node, torch.fx.Node):
        return tuple(node.meta.get("from_node") or ())
    return tuple(getattr(node, "from_node", None) or ())


def _original(fx_node: torch.fx.Node, names: dict[str, Any]) -> Any:
    """What ``names`` maps the nearest ``from_node`` ancestor of ``fx_node`` to (that exists
    there), else what it maps ``fx_node``'s own name to (as ``remap._original_name``)."""
    todo = list(_sources(fx_node))
    seen = 0
    while todo and seen < 64:
        node = todo.pop(0)
        seen += 1
        found = names.get(getattr(node, "name", None))
        if found is not None:
            return found
        todo.extend(_sources(node))
    return names.get(fx_node.name)


def _path_map(first: "list[Node]", this: "list[Node]") -> dict[str, str]:
    """Module paths of the first call -> the same modules' paths in this call."""
    out: dict[str, str] = {}
    for a, b in zip(first, this):
        if a.stack is None or b.stack is None:
            continue
        for ca, cb in zip(a.stack, b.stack):
            if ca.path != cb.path:
                out[ca.path] = cb.path
    return out


def _repath(props: dict[str, str], paths: dict[str, str], parsed: dict[str, Any]) -> None:
    """Module paths in a node's ``name_scopes`` / ``namespace`` mapped by ``paths``;
    ``parsed`` caches the texts' parts."""
    scopes = props.get(NAME_SCOPES)
    if scopes:
        if scopes not in parsed:
            try:
                parsed[scopes] = ast.literal_eval(scopes)
            except (ValueError, SyntaxError):
                parsed[scopes] = None
        items = parsed[scopes]
        if isinstance(items, list):
            props[NAME_SCOPES] = repr([paths.get(s, s) for s in items])
    namespace = props.get(NAMESPACE)
    if namespace:
        key = ("namespace", namespace)
        if key not in parsed:
            parsed[key] = [part.partition(": ") for part in namespace.split("/")]
        props[NAMESPACE] = "/".join(paths.get(path, path) + sep + rest
                                    for path, sep, rest in parsed[key])


def lower_per_body(program: torch.export.ExportedProgram, tree: GroupTree,
                   custom_translation_table: Mapping | None = None) -> PerBody:
    """The flat ONNX model of ``program`` and a resolver (see the module docstring); ops
    translated as ``torch.onnx.export(custom_translation_table=...)`` translates them."""
    # the collector paused: the many objects made here (fake tensors, FX and ONNX nodes) live
    # until the end, and each collection would also scan the program's (measured: the
    # inlining took 5-8x longer with it)
    with gc_paused():
        return _lower_per_body(program, tree, custom_translation_table)


def _lower_per_body(program: torch.export.ExportedProgram, tree: GroupTree,
                    custom_translation_table: Mapping | None) -> PerBody:
    tables = torch_private.lowering_tables(custom_translation_table)
    rebuilt, calls = rebuild(program, tree)
    decomposed = torch_private.decompose(rebuilt, tables)
    model = torch_private.translate(decomposed, tables)

    graph = tree.graph
    ir_by_name = {node.name: node for node in graph.nodes}
    fx_names = {node.name: node for node in graph.nodes}
    main = {n.name: n for n in decomposed.graph_module.graph.nodes}
    call_by_name = {call.name: i for i, call in enumerate(calls)}
    body_index = [{n.name: i for i, n in enumerate(call.nodes)} for call in calls]
    decomposed_body: dict[int, dict[str, torch.fx.Node]] = {}

    # mark every call node with its call, then inline every function
    for node in model.graph:
        if node.domain != _SUBGRAPH_DOMAIN:
            continue
        scopes = read_scopes(node)
        fx_call = main.get(scopes[0][-1]) if scopes else None
        origin = _origin_call(fx_call, call_by_name)
        if origin is None:
            raise Unsupported(f"cannot tell which call ONNX node {node.name} is")
        node.metadata_props[CALL_KEY] = str(origin)
        getter = fx_call.args[0]
        body = getattr(decomposed.graph_module, getter.target)
        decomposed_body[origin] = {n.name: n for n in body.graph.nodes}
    # torch.onnx.export converts its model to its default opset (onnxscript's converter
    # inlines every function first): here each body is converted once, then inlined (the
    # bodies, torchlib's helpers: each inlined node keeps its call's marks); dead nodes go
    # (the translation of a re-traced graph can leave a dead Constant that the flat export
    # does not have; it would upset outlining)
    torch_private.convert_opset(model)
    inline_functions(model)
    for cleanup in (common_passes.RemoveUnusedNodesPass(), common_passes.RemoveUnusedOpsetsPass()):
        cleanup(model)

    ir_nodes = [[graph.nodes[i] for i in call.group.all_nodes()] for call in calls]
    path_maps = {i: _path_map(ir_nodes[call.first], ir_nodes[i]) for i, call in enumerate(calls)
                 if call.first != i}
    first_names = {first: {n.name: n for n in calls[first].nodes}
                   for first in {call.first for call in calls}}
    facts: dict[int, NodeFacts | None] = {}
    # the nodes of every call of one body carry the same metadata texts until repathed, and
    # come from the same decomposed body nodes: parsed and traced back once per body node
    scopes_of: dict[tuple, Any] = {}
    position_of: dict[tuple[int, str], int | None] = {}

    def position(call: Call, fx_name: str, body: dict[str, torch.fx.Node]) -> int | None:
        key = (call.first, fx_name)
        if key not in position_of:
            fx = body.get(fx_name)
            source = _original(fx, first_names[call.first]) if fx is not None else None
            position_of[key] = (body_index[call.first].get(source.name)
                                if source is not None else None)
        return position_of[key]

    def resolve(onnx_node: ir.Node) -> NodeFacts:
        props = onnx_node.metadata_props
        key = (props.get(NAME_SCOPES), props.get(CLASS_HIERARCHY))
        if key not in scopes_of:
            scopes_of[key] = read_scopes(onnx_node)
        scopes = scopes_of[key]
        mark = props.get(CALL_KEY)
        original = None
        if scopes is not None and mark is None:
            fx = main.get(scopes[0][-1])
            if fx is not None and fx.op != "placeholder":
                original = _original(fx, fx_names)
        elif scopes is not None:
            index = int(mark)
            call = calls[index]
            at = position(call, scopes[0][-1], decomposed_body.get(index, {}))
            if at is not None:
                original = ir_by_name.get(call.nodes[at].name)
        if original is None or original.is_io:
            return NodeFacts(None, onnx_target(onnx_node))
        return NodeFacts(original.stack, original.target, original.tags)

    def resolver(onnx_node: ir.Node) -> NodeFacts:
        key = id(onnx_node)
        if key not in facts:
            facts[key] = resolve(onnx_node)
        return facts[key]

    parsed: dict[str, Any] = {}
    for node in model.graph:  # resolve while the marks are there, then repath, drop them
        resolver(node)
        mark = node.metadata_props.pop(CALL_KEY, None)
        if mark is not None and int(mark) in path_maps:
            _repath(node.metadata_props, path_maps[int(mark)], parsed)
    distinct = len({call.first for call in calls})
    return PerBody(model, resolver, distinct, len(calls))


def _origin_call(fx_call: torch.fx.Node | None, call_by_name: dict[str, int]) -> int | None:
    if fx_call is None:
        return None
    return _original(fx_call, call_by_name)
