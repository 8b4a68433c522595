"""Optimize an outlined model: every distinct function body once, and the main graph.

torch.onnx's optimizer on the flat export works through every block, although outlining then
keeps one of them. Here the export is not optimized; after outlining, the same optimizer
(onnxscript's ``optimize_ir``: constant and shape folding, its rewrite rules, unused nodes,
initializer dedup, CSE, name fixes) runs once per function body and once over the main graph.
Each body is optimized as a model of its own, whose graph is the body (its inputs are the
function's): onnxscript's CSE only visits a model's main graph, and some of its rewrite rules
make initializers, which a function cannot hold. The initializers this leaves in a body are
turned back into ``Constant`` nodes (with their metadata, where they were ``Constant`` nodes).

Values inside a body keep the shapes and types of the export (outlining moves the nodes and
their values, and a function input copies the type and shape of the value it stands for), so
shape-dependent folding still fires. A body is only shared by calls whose inputs have equal
types and shapes (they are part of its structural key, see ``outlining._body_keys``), so folding for
one call's shapes holds for all its calls. Folding can make bodies that differed equal:
``finishing._merge`` merges them afterwards.

Differences from optimizing the flat graph, where whole blocks are visible: weights are function
inputs, so nothing folds on weight *values* (the flat optimizer drops a Gemm bias that happens
to be all zeros, as in a randomly initialized model; in the main graph, with
``fold_weights=False``, a weight is not transposed into a copy either: :func:`_keeps_weights`),
and work the flat optimizer shares
between blocks (a causal mask's ``Where``) is done in each call; onnxruntime's CSE merges it
again after inlining the functions.

After the optimizer, ``Mul(a, Reciprocal(b))`` becomes ``Div(a, b)`` (:func:`divide`): torch
writes ``x * rsqrt(mean(x^2) + eps)``, which torchlib lowers to ``Sqrt`` + ``Reciprocal`` +
``Mul``, and onnxruntime fuses an RMSNorm into ``SimplifiedLayerNormalization`` only from
``Pow, ReduceMean, Add, Sqrt, Div, Mul``: with it, each call of the norm's one body is one
fused kernel once onnxruntime inlines the functions (a division instead of a multiplication by
the reciprocal: the same value within one rounding). Before it, torchlib's ``K^T`` in its
attention (``Reshape`` to 3-D, ``Transpose(perm=[0, 2, 1])``, ``Reshape`` back: a 4-D ``[a, b,
c, d]`` to ``[a, b, d, c]``) becomes one ``Transpose(perm=[0, 1, 3, 2])``
(:func:`fold_transposes`), which onnxruntime folds into the ``MatMul`` that reads it
(``FusedMatMul`` with ``transB``) instead of copying the key cache at every decode step.
"""

from __future__ import annotations

import contextlib
from typing import Collection, Iterator

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.optimizer import optimize_ir

from rewrite._private.errors import library_code
from rewrite.backends.onnx.summary import FunctionId
from rewrite.errors import LibraryError


def optimize(model: ir.Model, made: Collection[FunctionId], *, fold_weights: bool = True
             ) -> None:
    """Optimize ``model`` in place (see the module docstring); of its functions, only those
    outlining ``made`` (a function the input model had is left as it is); without
    ``fold_weights``, no weight of the main graph is transposed into a copy."""
    functions = dict(model.functions)
    where = "the main graph"

    def failed(e: Exception) -> LibraryError:
        return LibraryError("onnxscript", f"optimizing {where} (lower without its optimizer: "
                            "rewrite apply --no-optimize, OnnxOptions(optimize=False))", e)

    try:  # the optimizer's errors: LibraryError (exit 3); rewrite's own (a bug) surface
        with library_code(failed):
            for fid, function in functions.items():
                if fid in made:
                    where = f"function {fid[0]}::{fid[1]}"
                    _optimize_body(model, function)
            where = "the main graph"
            model.functions.clear()  # the main graph alone: bodies are done
            optimize_ir(model, inline=False,
                        **({} if fold_weights else {"should_fold": _keeps_weights}))
            if fold_transposes(model.graph):
                RemoveUnusedNodesPass()(model)
            divide(model.graph)
    finally:
        model.functions.clear()
        model.functions.update(functions)


def _keeps_weights(node: ir.Node) -> bool | None:
    """False for a ``Transpose`` of an initializer, else the optimizer's own choice.

    Folding it would store a transposed copy of a weight (onnxscript folds one of any size
    when the ``Transpose`` is its only reader: an untied LM head), which is neither the
    checkpoint's bytes nor a range of the input file; onnxruntime transposes such weights
    once when it loads the model."""
    if node.domain == "" and node.op_type == "Transpose" and any(
            value is not None and value.is_initializer() for value in node.inputs):
        return False
    return None


def _optimize_body(model: ir.Model, function: ir.Function) -> None:
    """``optimize_ir`` on a model whose graph is ``function``'s body."""
    graph = function.graph
    constant_meta = {node.outputs[0].name: dict(node.metadata_props) for node in graph
                     if node.op_type == "Constant" and node.domain == ""}
    body = ir.Model(graph, ir_version=model.ir_version)
    with _settings_as_inputs(graph):
        optimize_ir(body, inline=False)
        if fold_transposes(graph):  # shapes known now; unread shape computations go
            RemoveUnusedNodesPass()(body)
    divide(graph)
    for name, value in list(graph.initializers.items()):
        del graph.initializers[name]
        tensor = value.const_value
        node = ir.Node("", "Constant", (), (ir.Attr("value", ir.AttributeType.TENSOR, tensor),),
                       name=f"{name}_constant", metadata_props=constant_meta.get(name, {}))
        ir.convenience.replace_all_uses_with(value, node.outputs[0], replace_graph_outputs=True)
        node.outputs[0].name = name
        node.outputs[0].type, node.outputs[0].shape = value.type, value.shape
        graph.append(node)
    graph.sort()


def divide(graph: ir.Graph) -> None:
    """Each ``Mul(a, Reciprocal(b))`` of ``graph`` as ``Div(a, b)`` (the module docstring),
    where every reader of the ``Reciprocal`` is such a ``Mul``; the ``Mul``'s name, metadata
    and output kept."""
    for reciprocal in [node for node in graph if (node.domain, node.op_type) == ("",
                                                                                 "Reciprocal")]:
        made = reciprocal.outputs[0]
        uses = list(made.uses())
        if made.is_graph_output() or not uses or any(
                (use.node.domain, use.node.op_type) != ("", "Mul") or use.node.inputs[0] is
                use.node.inputs[1] for use in uses):
            continue
        for use in uses:
            mul = use.node
            div = ir.Node("", "Div", (mul.inputs[1 - use.idx], reciprocal.inputs[0]),
                          name=mul.name, metadata_props=dict(mul.metadata_props))
            graph.insert_after(mul, div)
            out = mul.outputs[0]
            ir.convenience.replace_all_uses_with(out, div.outputs[0],
                                                 replace_graph_outputs=True)
            graph.remove(mul, safe=True)
            div.outputs[0].name, div.outputs[0].type, div.outputs[0].shape = (
                out.name, out.type, out.shape)
        graph.remove(reciprocal, safe=True)


def fold_transposes(graph: ir.Graph) -> bool:
    """Each ``Reshape(Transpose(Reshape(x, [-1, a, b]), perm=[0, 2, 1]), [*p, b, a])`` of
    ``graph``, where ``p``, ``a``, ``b`` are slices ``[:-2]``, ``[-2:-1]``, ``[-1:]`` of
    ``Shape(x)`` (torchlib's ``K^T``: it swaps the last two dimensions of ``x``), as one
    ``Transpose`` of ``x`` swapping them (the module docstring). Whether any was; the shape
    computations it leaves unread are the caller's to remove."""
    folded = False
    for transpose in [node for node in graph if _is(node, "Transpose")]:
        before, uses = transpose.inputs[0].producer(), list(transpose.outputs[0].uses())
        if (tuple(transpose.attributes.get_ints("perm", ())) != (0, 2, 1) or before is None
                or not _is(before, "Reshape") or len(uses) != 1 or uses[0].idx != 0
                or not _is(uses[0].node, "Reshape")
                or len(list(before.outputs[0].uses())) != 1):
            continue
        after, x = uses[0].node, before.inputs[0]
        if x is None or x.shape is None or not _swaps(x, before.inputs[1], after.inputs[1]):
            continue
        rank = len(x.shape)
        node = ir.Node("", "Transpose", (x,),
                       (ir.AttrInt64s("perm", (*range(rank - 2), rank - 1, rank - 2)),),
                       name=transpose.name, metadata_props=dict(transpose.metadata_props))
        graph.insert_after(after, node)
        out = after.outputs[0]
        ir.convenience.replace_all_uses_with(out, node.outputs[0], replace_graph_outputs=True)
        graph.remove([after, transpose, before], safe=True)
        node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = (
            out.name, out.type, out.shape)
        folded = True
    return folded


def _is(node: ir.Node, op: str) -> bool:
    return node.domain == "" and node.op_type == op


def _swaps(x: ir.Value, first: ir.Value | None, second: ir.Value | None) -> bool:
    """Whether ``first`` is ``[-1, a, b]`` and ``second`` ``[*p, b, a]``, with ``p``, ``a``,
    ``b`` the slices ``[:-2]``, ``[-2:-1]``, ``[-1:]`` of ``Shape(x)``."""
    concats = [value.producer() if value is not None else None for value in (first, second)]
    if any(c is None or not _is(c, "Concat") or len(c.inputs) != 3 for c in concats):
        return False
    (minus, a, b), (p, b2, a2) = concats[0].inputs, concats[1].inputs  # type: ignore[union-attr]
    rank = len(x.shape)  # type: ignore[arg-type]
    if (a, b) != (a2, b2) or _constant(minus) != [-1]:
        return False
    return all(_slice_of_shape(value, x, rank) == bounds for value, bounds in
               ((p, (0, rank - 2)), (a, (rank - 2, rank - 1)), (b, (rank - 1, rank))))


def _constant(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in value.const_value.numpy().reshape(-1)]


def _slice_of_shape(value: ir.Value | None, x: ir.Value, rank: int) -> tuple[int, int] | None:
    """``(start, end)`` (non-negative, clamped to ``rank``) where ``value`` is a ``Slice`` of
    ``Shape(x)`` along its one axis with step 1; else None."""
    node = value.producer() if value is not None else None
    if node is None or not _is(node, "Slice") or len(node.inputs) > 5:
        return None
    shape = node.inputs[0].producer() if node.inputs[0] is not None else None
    if (shape is None or not _is(shape, "Shape") or shape.inputs[0] is not x
            or shape.attributes.get_int("start", 0) != 0 or "end" in shape.attributes):
        return None
    starts, ends = _constant(node.inputs[1]), _constant(node.inputs[2])
    rest = [_constant(v) for v in node.inputs[3:]]
    if starts is None or ends is None or len(starts) != 1 or any(
            r not in ([0], [1]) for r in rest) or (len(rest) == 2 and rest[1] != [1]):
        return None
    return tuple(min(max(i + rank if i < 0 else i, 0), rank)  # type: ignore[return-value]
                 for i in (starts[0], ends[0]))


@contextlib.contextmanager
def _settings_as_inputs(graph: ir.Graph) -> Iterator[None]:
    """Within the block, each ``Constant`` whose value is a function attribute (a scalar
    setting, see ``finishing._merge``) is an input of ``graph``: the optimizer would fold it
    as a constant of an unknown (NaN) value. The nodes are put back afterwards."""
    settings = [node for node in graph if node.op_type == "Constant" and node.domain == ""
                and any(attr.is_ref() for attr in node.attributes.values())]
    stand_ins = []
    for node in settings:
        made = node.outputs[0]
        value = ir.Value(name=made.name, type=made.type, shape=made.shape)
        ir.convenience.replace_all_uses_with(made, value)
        graph.remove(node)
        graph.inputs.append(value)
        stand_ins.append(value)
    try:
        yield
    finally:
        for node, value in zip(settings, stand_ins):
            graph.inputs.remove(value)
            graph.append(node)
            ir.convenience.replace_all_uses_with(value, node.outputs[0],
                                                 replace_graph_outputs=True)
        if settings:
            graph.sort()
