"""Attention inside each function body as one opset-23 ``Attention`` node.

torchlib writes ``scaled_dot_product_attention`` as ``MatMul(Mul(Q, s), Mul(Transpose(K), s))``,
the mask added (a boolean one as ``Where(mask, 0, lowest)``), ``Softmax``, a ``Where(IsNaN)``
guard and ``MatMul(P, V)``; transformers' ``repeat_kv`` first copies the grouped key / value
heads (``Unsqueeze`` at axis 2, ``Expand``, ``Reshape``) up to the query's. :func:`fuse_attention`
writes each such subgraph of a body as ``Attention(Q, K, V, mask, scale=s*s)`` on the grouped
heads (the standard op takes ``H`` query heads over ``H / r`` key heads, head ``h`` reading
``h // r``: ``repeat_kv``'s order), and where ``K`` and ``V`` are the key cache's ``Concat``
(``past`` along the sequence, then the new token's), it takes the past and the new parts
and gives the concatenations as its ``present_key`` / ``present_value``: onnxruntime 1.32 runs
one CPU kernel for what were ~25 nodes per layer, with no copy of the grouped cache to all the
query heads at each decode step.

Anything else is left as it is (the body keeps its unfused attention): a softmax capped
(``tanh``, Gemma-2), a mask that is neither boolean nor of the query's type, keys repeated
another way, a scale that is not a constant. The mask is passed as given (a causal or sliding
window mask stays the model's). One difference: a query row whose mask is all false (padding)
reads zeros from ``Attention``, where torchlib's lowering averages every value.

It runs once per distinct function body (:class:`finishing._passes.FuseAttention`); a body
that fuses imports the default domain at :data:`OPSET`, and so do the model and its other
functions (one version of a domain per model).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_ir as ir
from attrs import frozen
from onnx_ir.passes.common import RemoveUnusedNodesPass

OPSET = 23
"""The first opset of ``Attention``."""

_LOWEST = -1e30
"""A boolean mask's ``Where`` fills at most this (torchlib: the type's lowest value)."""


@frozen
class _Match:
    """One attention subgraph: the nodes it ends at, its inputs, its scale."""

    end: ir.Node
    query: ir.Value
    key: ir.Value
    value: ir.Value
    mask: ir.Value | None
    scale: float


def fuse_attention(graph: ir.Graph) -> int:
    """Each attention subgraph of ``graph`` as one ``Attention`` (the module docstring), the
    cache's ``Concat`` folded in; how many were fused. Nodes left unread are removed."""
    matches = [m for m in (_match(node) for node in list(graph) if _is(node, "Softmax"))
               if m is not None]
    for match in matches:
        node = ir.Node("", "Attention", (match.query, match.key, match.value, match.mask),
                       (ir.AttrFloat32("scale", match.scale),), name=match.end.name,
                       metadata_props=dict(match.end.metadata_props))
        _replace(graph, match.end, node)
    if matches:
        _remove_unused(graph)
        for node in [n for n in graph if _is(n, "Attention")]:
            _fold_cache(graph, node)
        _remove_unused(graph)
    return len(matches)


def _replace(graph: ir.Graph, old: ir.Node, new: ir.Node, outputs: int = 1) -> None:
    """``new`` after ``old``, its first ``outputs`` outputs standing for ``old``'s."""
    graph.insert_after(old, new)
    for before, after in zip(old.outputs[:outputs], new.outputs[:outputs]):
        _stand_in(before, after)


def _stand_in(old: ir.Value, new: ir.Value) -> None:
    """``new`` read wherever ``old`` was (graph outputs too), with its name, type, shape."""
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    new.name, new.type, new.shape = old.name, old.type, old.shape
    old.name = None


def _remove_unused(graph: ir.Graph) -> None:
    RemoveUnusedNodesPass()(ir.Model(graph, ir_version=10))


def _match(softmax: ir.Node) -> _Match | None:
    """The attention subgraph through ``softmax``, or None."""
    scores, rank = softmax.inputs[0], 4
    if scores is None or softmax.attributes.get_int("axis", -1) not in (-1, rank - 1):
        return None
    product, mask = _scores(scores)
    if product is None or len(product.inputs) != 2:
        return None
    (query, q_scale), (key_t, k_scale) = (_scaled(v) for v in product.inputs)
    transpose = key_t.producer() if key_t is not None else None
    if (query is None or transpose is None or not _is(transpose, "Transpose")
            or tuple(transpose.attributes.get_ints("perm", ())) != (0, 1, 3, 2)
            or q_scale is None or k_scale is None):
        return None
    end = _reader(softmax.outputs[0])
    if end is None or end.inputs[1] is None:
        return None
    key, value = (_grouped(v) for v in (transpose.inputs[0], end.inputs[1]))
    if key is None or value is None or (key is transpose.inputs[0]) != (value is end.inputs[1]):
        return None
    if not _fits(query, key, value, mask):
        return None
    return _Match(end, query, key, value, mask, q_scale * k_scale)


def _scores(scores: ir.Value) -> tuple[ir.Node | None, ir.Value | None]:
    """The ``MatMul`` of ``Q K^T`` under ``scores`` and the mask added to it (None: none)."""
    node = scores.producer()
    if node is not None and _is(node, "MatMul"):
        return node, None
    if node is None or not _is(node, "Add"):
        return None, None
    for i in (0, 1):
        made, other = node.inputs[i], node.inputs[1 - i]
        product = made.producer() if made is not None else None
        if product is not None and _is(product, "MatMul") and other is not None:
            return product, _mask(other)
    return None, None


def _mask(added: ir.Value) -> ir.Value | None:
    """The boolean mask of ``Where(mask, 0, lowest)``, else ``added`` itself (a float mask)."""
    node = added.producer()
    if node is not None and _is(node, "Where") and node.inputs[0] is not None:
        zero, fill = (_scalar(v) for v in node.inputs[1:])
        if (node.inputs[0].dtype == ir.DataType.BOOL and zero == 0.0 and fill is not None
                and fill <= _LOWEST):
            return node.inputs[0]
    return added


def _scaled(value: ir.Value | None) -> tuple[ir.Value | None, float | None]:
    """``(x, s)`` where ``value`` is ``Mul(x, s)`` with ``s`` a constant scalar; ``(value,
    1.0)`` where it is no ``Mul``."""
    node = value.producer() if value is not None else None
    if node is None or not _is(node, "Mul"):
        return value, 1.0
    for i in (0, 1):
        factor = _scalar(node.inputs[1 - i])
        if factor is not None:
            return node.inputs[i], factor
    return None, None


def _reader(probabilities: ir.Value) -> ir.Node | None:
    """The ``MatMul(P, V)`` reading the softmax ``probabilities``, through torchlib's
    ``Where(IsNaN(P), 0, P)`` if there; None where anything else reads them."""
    uses = list(probabilities.uses())
    nodes = {use.node for use in uses}
    if len(uses) == 1 and _is(uses[0].node, "MatMul") and uses[0].idx == 0:
        return uses[0].node
    isnan = [n for n in nodes if _is(n, "IsNaN")]
    where = [n for n in nodes if _is(n, "Where")]
    if len(nodes) != 2 or len(isnan) != 1 or len(where) != 1:
        return None
    guard = where[0]
    if (guard.inputs[0] is not isnan[0].outputs[0] or _scalar(guard.inputs[1]) != 0.0
            or guard.inputs[2] is not probabilities):
        return None
    after = list(guard.outputs[0].uses())
    if len(after) == 1 and _is(after[0].node, "MatMul") and after[0].idx == 0:
        return after[0].node
    return None


def _grouped(value: ir.Value | None) -> ir.Value | None:
    """The grouped heads ``x`` where ``value`` is ``repeat_kv(x)`` (``Reshape(Expand(
    Unsqueeze(x, [2]), [b, g, r, t, d]), [b, g * r, t, d])``: the reshape keeps the batch,
    sequence and head size of the expand), else ``value`` itself."""
    reshape = value.producer() if value is not None else None
    if reshape is None or not _is(reshape, "Reshape"):
        return value
    expand = _producer(reshape.inputs[0], "Expand")
    unsqueeze = _producer(expand.inputs[0], "Unsqueeze") if expand is not None else None
    if expand is None or unsqueeze is None or _ints(unsqueeze.inputs[1]) != [2]:
        return value
    spread, merged = (_parts(v) for v in (expand.inputs[1], reshape.inputs[1]))
    if spread is None or merged is None or len(spread) != 5 or len(merged) != 4:
        return value
    x = unsqueeze.inputs[0]
    if x is None or x.shape is None or len(x.shape) != 4 or not all(
            _same(merged[i], spread[j]) for i, j in ((0, 0), (2, 3), (3, 4))):
        return value
    groups = _ints(spread[1])
    if groups is None or not isinstance(x.shape[1], int) or groups != [x.shape[1]]:
        return value
    return x


def _fits(query: ir.Value, key: ir.Value, value: ir.Value, mask: ir.Value | None) -> bool:
    """4-D ``query``, ``key``, ``value`` of one float type, ``key`` with as many heads as
    ``value`` and a divisor of the query's (where known); a mask boolean or of that type."""
    values = (query, key, value)
    if any(v.shape is None or len(v.shape) != 4 for v in values):
        return False
    dtype = query.dtype
    if dtype is None or not dtype.is_floating_point() or key.dtype != dtype or value.dtype != (
            dtype):
        return False
    heads, groups = query.shape[1], key.shape[1]
    if isinstance(heads, int) and isinstance(groups, int) and (
            heads % groups or value.shape[1] != groups):
        return False
    return mask is None or mask.dtype in (ir.DataType.BOOL, dtype)


def _fold_cache(graph: ir.Graph, node: ir.Node) -> None:
    """``Attention(Q, Concat(pk, k), Concat(pv, v), mask)`` as ``Attention(Q, k, v, mask, pk,
    pv)`` giving the concatenations as ``present_key`` / ``present_value``."""
    concats = [_producer(v, "Concat") for v in node.inputs[1:3]]
    if any(c is None or len(c.inputs) != 2 or c.attributes.get_int("axis", 0) not in (2, -2)
           or any(i is None for i in c.inputs) for c in concats):
        return
    (past_k, new_k), (past_v, new_v) = (c.inputs for c in concats)  # type: ignore[union-attr]
    inputs = (node.inputs[0], new_k, new_v, node.inputs[3], past_k, past_v)
    if _reads_any(inputs, {c.outputs[0] for c in concats}):  # type: ignore[union-attr]
        return  # the mask or the query is computed from the cache (Doge): a cycle if folded
    fused = ir.Node("", "Attention", (node.inputs[0], new_k, new_v, node.inputs[3], past_k,
                                      past_v), node.attributes.values(), num_outputs=3,
                    name=node.name, metadata_props=dict(node.metadata_props))
    _replace(graph, node, fused)
    for concat, out in zip(concats, fused.outputs[1:]):
        _stand_in(concat.outputs[0], out)  # type: ignore[union-attr]


def _reads_any(values: Sequence[ir.Value | None], read: set[ir.Value]) -> bool:
    """Whether any of ``values`` is computed, through any path, from a value of ``read``."""
    seen: set[ir.Node] = set()
    todo = [v.producer() for v in values if v is not None]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if any(v in read for v in node.inputs):
            return True
        todo.extend(v.producer() for v in node.inputs if v is not None)
    return False


def _is(node: ir.Node, op: str) -> bool:
    return node.domain == "" and node.op_type == op


def _producer(value: ir.Value | None, op: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and _is(node, op) else None


def _parts(value: ir.Value | None) -> list[ir.Value] | None:
    """The one-element inputs of the ``Concat`` making a shape ``value``."""
    concat = _producer(value, "Concat")
    if concat is None or any(v is None for v in concat.inputs):
        return None
    return list(concat.inputs)  # type: ignore[arg-type]


def _same(a: ir.Value, b: ir.Value) -> bool:
    """One value, or two constants of equal values."""
    return a is b or (_ints(a) is not None and _ints(a) == _ints(b))


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant (an initializer, a ``Constant`` node's output), else None."""
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _ints(value: ir.Value | None) -> list[int] | None:
    array = _constant(value)
    return None if array is None or array.dtype.kind not in "iu" else [
        int(v) for v in array.reshape(-1)]


def _scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element floating-point constant, else None."""
    array = _constant(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def flatten_heads(graph: ir.Graph) -> int:
    """Each ``Attention`` of ``graph`` reading ``[batch, heads, sequence, head]`` views of
    ``[batch, sequence, heads * head]`` projections (``Transpose(Reshape(x))``, through a
    ``RotaryEmbedding``) and read back the same way, on the 3-D projections themselves
    (``q_num_heads`` / ``kv_num_heads``; the rotary with ``num_heads``): three ``Reshape`` +
    ``Transpose`` pairs in and one out fewer per layer. How many."""
    done = 0
    for node in [n for n in graph if _is(n, "Attention") and len(n.inputs) == 6]:
        views = [_view(v) for v in node.inputs[:3]]
        out = _merged(node.outputs[0])
        if any(v is None for v in views) or out is None or views[2][1] is not None:
            continue
        inputs = [_flat_rotary(graph, *view) for view in views]  # type: ignore[misc]
        heads = [view[2] for view in views]  # type: ignore[index]
        attrs = [*node.attributes.values(), ir.AttrInt64("q_num_heads", heads[0]),
                 ir.AttrInt64("kv_num_heads", heads[1])]
        flat = ir.Node("", "Attention", (*inputs, *node.inputs[3:]), attrs, num_outputs=3,
                       name=node.name, metadata_props=dict(node.metadata_props))
        graph.insert_after(node, flat)
        for old, new in zip([out, *node.outputs[1:]], flat.outputs):
            _stand_in(old, new)
        done += 1
    if done:
        _remove_unused(graph)
        graph.sort()
    return done


def _view(value: ir.Value | None) -> tuple[ir.Value, ir.Node | None, int] | None:
    """``(x, rotary, heads)`` where ``value`` is ``[rotary](Transpose(Reshape(x), [0, 2, 1,
    3]))`` splitting the last dimension of a 3-D ``x`` into ``heads`` static heads (``rotary``
    a 4-D ``RotaryEmbedding``, read only there, or None)."""
    rotary = value.producer() if value is not None else None
    if rotary is not None and _is(rotary, "RotaryEmbedding") and len(rotary.inputs) == 3:
        if len(list(rotary.outputs[0].uses())) != 1:
            return None
        value = rotary.inputs[0]
    else:
        rotary = None
    transpose = _producer(value, "Transpose")
    reshape = _producer(transpose.inputs[0], "Reshape") if transpose is not None else None
    if (transpose is None or reshape is None or tuple(transpose.attributes.get_ints(
            "perm", ())) != (0, 2, 1, 3)):
        return None
    x, split = reshape.inputs[0], reshape.outputs[0].shape
    if x is None or x.shape is None or split is None or len(x.shape) != 3 or len(split) != 4:
        return None
    heads, size = split[2], split[3]
    if (not isinstance(heads, int) or not isinstance(size, int) or x.shape[2] != heads * size
            or x.shape[0] != split[0] or x.shape[1] != split[1]):
        return None
    return x, rotary, heads


def _merged(value: ir.Value) -> ir.Value | None:
    """The 3-D ``Reshape(Transpose(value, [0, 2, 1, 3]))`` merging the heads back (after a
    ``Reshape`` to ``value``'s own shape, torch's ``view``), where it is the only reader of
    ``value``."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    transpose = uses[0].node
    if _is(transpose, "Reshape") and value.shape is not None and (
            transpose.outputs[0].shape == value.shape) and all(
            isinstance(d, int) or d.value is not None for d in value.shape):
        uses = list(transpose.outputs[0].uses())
        transpose = uses[0].node if len(uses) == 1 else transpose
    if not _is(transpose, "Transpose"):
        return None
    after = list(transpose.outputs[0].uses())
    if (tuple(transpose.attributes.get_ints("perm", ())) != (0, 2, 1, 3) or len(after) != 1
            or not _is(after[0].node, "Reshape") or after[0].idx != 0):
        return None
    split, out = transpose.outputs[0].shape, after[0].node.outputs[0]
    if (split is None or out.shape is None or len(split) != 4 or len(out.shape) != 3
            or not isinstance(split[2], int) or not isinstance(split[3], int)
            or out.shape[2] != split[2] * split[3] or out.shape[:2] != split[:2]):
        return None
    return out


def _flat_rotary(graph: ir.Graph, x: ir.Value, rotary: ir.Node | None, heads: int
                 ) -> ir.Value:
    """``x``, rotated where ``rotary`` is given (the same caches, ``num_heads``)."""
    if rotary is None:
        return x
    node = ir.Node("", "RotaryEmbedding", (x, *rotary.inputs[1:]),
                   (*rotary.attributes.values(), ir.AttrInt64("num_heads", heads)),
                   name=rotary.name, metadata_props=dict(rotary.metadata_props))
    graph.insert_after(rotary, node)
    return node.outputs[0]
