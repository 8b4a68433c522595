"""Rotary position embeddings inside each function body as opset-23 ``RotaryEmbedding``.

transformers' ``apply_rotary_pos_emb`` lowers to ``x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = Concat(-x[..., h:], x[..., :h])`` and ``cos`` / ``sin`` unsqueezed at the
head axis: ~9 nodes for each of the query and the key per layer. ``RotaryEmbedding`` (not
interleaved, a 4-D ``[batch, heads, sequence, 2h]`` input, caches ``[batch, sequence, h]``)
computes the same where ``cos[..., :h] == cos[..., h:]`` (and ``sin``): it reads one half.
That is proven, not assumed: every call passing the body its ``cos`` / ``sin`` is followed
(through the functions calling it, into the function computing them) to
``Cos`` / ``Sin`` (times a constant) of ``Concat(f, f)`` along the last axis, the
frequencies doubled as transformers writes them; where any path ends elsewhere, the body
keeps its unfused form. The halves are sliced once per body and read by both rotations.
"""

from __future__ import annotations

from collections import defaultdict

import onnx_ir as ir

from rewrite.backends.onnx.finishing._attention import (
    _ints,
    _is,
    _producer,
    _remove_unused,
    _replace,
    _scalar,
)
from rewrite.backends.onnx.summary import FunctionId

Sites = dict[FunctionId, list[ir.Node]]


def call_sites(model: ir.Model) -> Sites:
    """Function -> the nodes calling it, in the main graph and in every function."""
    sites: Sites = defaultdict(list)
    for graph in [model.graph, *(f.graph for f in model.functions.values())]:
        for node in graph:
            fid = (node.domain, node.op_type, node.overload)
            if fid in model.functions:
                sites[fid].append(node)
    return sites


def fuse_rotary(model: ir.Model, fid: FunctionId, sites: Sites) -> int:
    """Each rotation of function ``fid``'s body as one ``RotaryEmbedding`` (the module
    docstring); how many."""
    graph, halves = model.functions[fid].graph, {}
    fused = 0
    for add in [node for node in graph if _is(node, "Add")]:
        found = _match(add)
        if found is None:
            continue
        x, cos, sin, half = found
        if not all(_doubled(model, sites, fid, v, 0) for v in (cos, sin)):
            continue
        caches = [halves.get((v, half)) or _half(graph, v, half, halves) for v in (cos, sin)]
        node = ir.Node("", "RotaryEmbedding", (x, *caches), name=add.name,
                       metadata_props=dict(add.metadata_props))
        _replace(graph, add, node)
        fused += 1
    if fused:
        _remove_unused(graph)
        graph.sort()
    return fused


def _half(graph: ir.Graph, value: ir.Value, half: int, made: dict) -> ir.Value:
    """``value[..., :half]``, written once in ``graph`` (sorted by the caller); its bounds
    shared by every such slice."""
    if half not in made:
        constants = [ir.Node("", "Constant", (), (ir.AttrTensor("value", ir.tensor([v])),))
                     for v in (0, half, -1)]
        graph.extend(constants)
        made[half] = [c.outputs[0] for c in constants]
    node = ir.Node("", "Slice", (value, *made[half]))
    graph.append(node)
    made[(value, half)] = node.outputs[0]
    return node.outputs[0]


def _match(add: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value, int] | None:
    """``(x, cos, sin, h)`` where ``add`` is ``x * Unsqueeze(cos, [1]) + rotate_half(x) *
    Unsqueeze(sin, [1])`` with ``x`` 4-D of a static last dimension ``2h``."""
    products = [_producer(v, "Mul") for v in add.inputs]
    if any(p is None for p in products):
        return None
    for first, second in (products, products[::-1]):
        for i in (0, 1):
            x, cos = first.inputs[i], _unsqueezed(first.inputs[1 - i])  # type: ignore[union-attr]
            if x is None or cos is None or x.shape is None or len(x.shape) != 4:
                continue
            size = x.shape[3]
            if not isinstance(size, int) or size % 2:
                continue
            for j in (0, 1):
                sin = _unsqueezed(second.inputs[1 - j])  # type: ignore[union-attr]
                if sin is not None and _rotated(second.inputs[j], x, size // 2):  # type: ignore
                    return x, cos, sin, size // 2
    return None


def _unsqueezed(value: ir.Value | None) -> ir.Value | None:
    """``c`` where ``value`` is ``Unsqueeze(c, [1])`` of a 3-D ``c``."""
    node = _producer(value, "Unsqueeze")
    if node is None or _ints(node.inputs[1]) != [1]:
        return None
    c = node.inputs[0]
    return c if c is not None and c.shape is not None and len(c.shape) == 3 else None


def _rotated(value: ir.Value | None, x: ir.Value, half: int) -> bool:
    """Whether ``value`` is ``Concat(Neg(x[..., half:]), x[..., :half])`` on the last axis."""
    concat = _producer(value, "Concat")
    if concat is None or len(concat.inputs) != 2 or concat.attributes.get_int(
            "axis", 0) not in (-1, 3):
        return False
    neg = _producer(concat.inputs[0], "Neg")
    return neg is not None and _slice(neg.inputs[0], x, half, None) and _slice(
        concat.inputs[1], x, 0, half)


def _slice(value: ir.Value | None, x: ir.Value, start: int, end: int | None) -> bool:
    """Whether ``value`` is ``x[..., start:end]`` (``end`` None: to the end)."""
    node = _producer(value, "Slice")
    if node is None or node.inputs[0] is not x or len(node.inputs) < 4:
        return False
    starts, ends, axes = (_ints(v) for v in node.inputs[1:4])
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 else [1]
    last = x.shape[3]  # type: ignore[index]
    return (starts == [start] and axes in ([-1], [3]) and steps == [1] and ends is not None
            and len(ends) == 1 and (ends[0] >= last if end is None else ends[0] == end))


def _doubled(model: ir.Model, sites: Sites, fid: FunctionId | None, value: ir.Value,
             depth: int) -> bool:
    """Whether ``value`` (in function ``fid``'s body; ``fid`` None: the main graph) is
    ``Cos`` / ``Sin`` (times a constant) of ``Concat(f, f)`` on the last axis on every path."""
    if depth > 16:
        return False
    node = value.producer()
    if node is None:  # an input: every call must pass such a value
        graph = model.functions[fid].graph if fid is not None else None
        if graph is None or value not in graph.inputs:
            return False
        index = graph.inputs.index(value)
        callers = _callers(model, sites, fid)
        return bool(callers) and all(
            len(call.inputs) > index and call.inputs[index] is not None and _doubled(
                model, sites, owner, call.inputs[index], depth + 1) for owner, call in callers)
    callee = (node.domain, node.op_type, node.overload)
    if callee in model.functions:
        out = model.functions[callee].graph.outputs[list(node.outputs).index(value)]
        return _doubled(model, sites, callee, out, depth + 1)
    if _is(node, "Mul") and any(_scalar(v) is not None for v in node.inputs):
        other = next(v for v in node.inputs if _scalar(v) is None)
        return other is not None and _doubled(model, sites, fid, other, depth + 1)
    if not (_is(node, "Cos") or _is(node, "Sin")):
        return False
    concat = _producer(node.inputs[0], "Concat")
    return (concat is not None and len(concat.inputs) == 2 and concat.inputs[0] is
            concat.inputs[1] and concat.attributes.get_int("axis", 0) == -1)


def _callers(model: ir.Model, sites: Sites, fid: FunctionId
             ) -> list[tuple[FunctionId | None, ir.Node]]:
    """(the function whose body holds it, None for the main graph; the node) of each call of
    ``fid``."""
    owners = {id(model.graph): None} | {id(f.graph): key for key, f in model.functions.items()}
    return [(owners.get(id(node.graph)), node) for node in sites.get(fid, [])]
