"""onnxruntime's fused ops inside each function body (``--target onnxruntime``).

After :mod:`._attention` and :mod:`._rotary` (standard ops), two rewrites in the bodies, once
per distinct body, in the ``com.microsoft`` domain (onnxruntime's contrib ops; other runtimes
do not read them):

* :func:`group_query_attention`: the flattened ``Attention(Q, K, V, mask, past_key,
  past_value)`` (3-D projections, ``q_num_heads`` / ``kv_num_heads``, a boolean mask, no
  other attribute but ``scale``) as ``GroupQueryAttention``, which is causal by itself and
  reads the valid length of each row instead of the mask: ``seqlens_k`` (the mask's last row
  summed, minus one: the builder's ``ReduceSum(attention_mask) - 1``) and
  ``total_sequence_length`` (the mask's last dimension) are computed from the mask in the
  body. So the model's mask must be causal over the tokens it keeps, its padding on the
  right (a left-padded row is read as right-padded; the builder's model has the same
  convention), no sliding window (the caller decides:
  :func:`rewrite.exporting.precision.onnxruntime_ops`).
* :func:`skip_norms`: a residual ``Add(a, b)`` read by a call of an RMSNorm function (body
  ``x / Sqrt(ReduceMean(x ** 2, -1) + eps) * w``) as ``SkipSimplifiedLayerNormalization(a,
  b, w, epsilon=eps)``, its fourth output standing for the sum.
"""

from __future__ import annotations

import onnx_ir as ir

from rewrite.backends.onnx.finishing._attention import (
    _is,
    _producer,
    _remove_unused,
    _replace,
    _scalar,
    _stand_in,
)
from rewrite.backends.onnx.summary import FunctionId

DOMAIN = "com.microsoft"


def group_query_attention(graph: ir.Graph) -> int:
    """Each flattened ``Attention`` of ``graph`` with a boolean mask as ``GroupQueryAttention``
    (module docstring); how many."""
    done, lengths = 0, None
    for node in [n for n in graph if _is(n, "Attention")]:
        heads = [node.attributes.get_int(n) for n in ("q_num_heads", "kv_num_heads")]
        mask = node.inputs[3] if len(node.inputs) == 6 else None
        if (None in heads or mask is None or mask.dtype != ir.DataType.BOOL
                or len(node.outputs) != 3 or set(node.attributes) - {
                    "scale", "q_num_heads", "kv_num_heads"} or mask.shape is None
                or len(mask.shape) != 4):
            continue
        if lengths is None:
            lengths = _lengths(graph, mask)
        elif lengths[2] is not mask:
            continue
        attrs = [ir.AttrInt64("num_heads", heads[0]), ir.AttrInt64("kv_num_heads", heads[1])]
        if "scale" in node.attributes:
            attrs.append(ir.AttrFloat32("scale", node.attributes.get_float("scale")))
        fused = ir.Node(DOMAIN, "GroupQueryAttention",
                        (*node.inputs[:3], *node.inputs[4:6], *lengths[:2]), attrs,
                        num_outputs=3, name=node.name, metadata_props=dict(node.metadata_props))
        _replace(graph, node, fused, outputs=3)
        done += 1
    if done:
        _remove_unused(graph)
        graph.sort()
    return done


def _lengths(graph: ir.Graph, mask: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``(seqlens_k, total_sequence_length, mask)``: int32 ``[batch]`` and scalar, from the
    boolean ``[batch, 1, query, key]`` mask's last query row, appended to ``graph``."""
    def constant(value: ir.Value | list, dtype: str = "int64") -> ir.Value:
        import numpy as np

        node = ir.Node("", "Constant", (), (ir.AttrTensor("value", ir.tensor(
            np.array(value, dtype=dtype))),))
        graph.append(node)
        return node.outputs[0]

    def op(kind: str, *inputs: ir.Value, **attrs: int) -> ir.Value:
        node = ir.Node("", kind, inputs, [ir.AttrInt64(k, v) for k, v in attrs.items()])
        graph.append(node)
        return node.outputs[0]

    last = op("Slice", mask, constant([-1]), constant([2 ** 62]), constant([2]))
    counts = op("ReduceSum", op("Cast", last, to=ir.DataType.INT32), constant([1, 2, 3]),
                keepdims=0)
    seqlens = op("Sub", counts, constant(1, "int32"))
    total = op("Squeeze", op("Cast", op("Shape", mask, start=3, end=4),
                             to=ir.DataType.INT32), constant([0]))
    return seqlens, total, mask


def skip_norms(model: ir.Model, fid: FunctionId) -> int:
    """Each residual ``Add`` of function ``fid``'s body read by a call of an RMSNorm function
    as ``SkipSimplifiedLayerNormalization`` (module docstring); how many."""
    graph, done = model.functions[fid].graph, 0
    for call in list(graph):
        callee = model.functions.get((call.domain, call.op_type, call.overload))
        epsilon = _rms_epsilon(callee) if callee is not None else None
        add = _producer(call.inputs[0], "Add") if call.inputs else None
        if (epsilon is None or add is None or len(call.inputs) != 2 or any(
                v is None or v.shape is None or len(v.shape) != 3 for v in add.inputs)
                or add.inputs[0].shape != add.inputs[1].shape):  # type: ignore[union-attr]
            continue
        fused = ir.Node(DOMAIN, "SkipSimplifiedLayerNormalization",
                        (*add.inputs, call.inputs[1]), (ir.AttrFloat32("epsilon", epsilon),),
                        num_outputs=4, name=call.name, metadata_props=dict(call.metadata_props))
        _replace(graph, call, fused)
        _stand_in(add.outputs[0], fused.outputs[3])
        done += 1
    if done:
        _remove_unused(graph)
        graph.sort()
    return done


def _rms_epsilon(function: ir.Function) -> float | None:
    """``eps`` where ``function(x, w)`` is ``w * (x / Sqrt(ReduceMean(Pow(x, 2), [-1]) +
    eps))`` (either order of the products), else None."""
    graph = function.graph
    if len(graph.inputs) != 2 or len(graph.outputs) != 1:
        return None
    x, weight = graph.inputs
    mul = _producer(graph.outputs[0], "Mul")
    if mul is None or weight not in mul.inputs:
        return None
    div = _producer(mul.inputs[1 - list(mul.inputs).index(weight)], "Div")
    sqrt = _producer(div.inputs[1], "Sqrt") if div is not None and div.inputs[0] is x else None
    add = _producer(sqrt.inputs[0], "Add") if sqrt is not None else None
    if add is None:
        return None
    for i in (0, 1):
        mean, epsilon = _producer(add.inputs[i], "ReduceMean"), _scalar(add.inputs[1 - i])
        power = _producer(mean.inputs[0], "Pow") if mean is not None else None
        if (epsilon is not None and power is not None and power.inputs[0] is x
                and _scalar(power.inputs[1]) == 2.0 and mean.attributes.get_int(
                    "keepdims", 1) == 1 and _axes(mean) in ([-1], [2])):  # type: ignore
            return epsilon
    return None


def _axes(node: ir.Node) -> list[int] | None:
    from rewrite.backends.onnx.finishing._attention import _ints

    return _ints(node.inputs[1]) if len(node.inputs) > 1 else None
