"""Float weights written ``[K, N]``: no ``Transpose`` of a weight left in the model.

torch.onnx writes a Linear as ``MatMul(x, Transpose(W))`` with ``W`` as stored, ``[out,
in]``; inside a layer function ``W`` is an input, so nothing can fold the ``Transpose``
before the model runs. onnxruntime then transposes each weight at every run when it does not
optimize (a verifying session: a 1.24B model's two runs 18 s and 4 GB of transposed copies),
or folds it at load into a copy when it does. :func:`transpose_weights` writes each such
weight transposed instead, ``[in, out]`` as ``MatMul`` takes it (as onnxruntime-genai's
builder writes them), and drops the ``Transpose`` in the main graph and in every function
body: one body still serves every layer of its class.

The weights found are those :mod:`rewrite.backends.onnx.quantize` quantizes in the ``[out,
in]`` layout (:func:`~rewrite.backends.onnx.weight_slots.weight_slots`: where a function's
input arrives from), but only a weight no other node reads: a tied embedding's table, also
gathered, keeps its layout and its ``Transpose``, so that it is not written twice.
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx_ir as ir

from rewrite.backends.onnx._blockwise import weight_values
from rewrite.backends.onnx.weight_slots import (
    Slot, call_sites, callee, input_layout, is_weight, passes_weight, weight_slots, weight_use)


def transpose_weights(model: ir.Model, sources: Mapping[str, Any] | None = None,
                      float32: bool = False) -> tuple[str, ...]:
    """Write every ``[out, in]`` weight read only by ``MatMul`` s ``[in, out]`` (see the
    module), in place, each transposed when it is written; the names of the weights so
    written (their names kept). ``sources``: initializer name -> the tensor it is written
    from (or a function making it), instead of its value; ``float32``: written in float32,
    converted as it is transposed."""
    functions = {f.identifier(): f for f in model.functions.values()}
    calls, opaque = call_sites(model, functions)
    slots = {slot for slot, layout in weight_slots(
        model, functions, calls, opaque, _any_weight).items() if layout == "NK"}
    graph = model.graph
    while True:  # a weight also read otherwise is not transposed: nor are its slots
        weights = _transposable(graph, slots)
        layouts, passed = dict.fromkeys(slots, "NK"), set(weights)
        kept = {(fid, index) for fid, index in slots if _kept(
            functions[fid], index, calls[fid], layouts, passed)}
        if kept == slots:
            break
        slots = kept
    for function in functions.values():
        for index, value in enumerate(function.inputs):
            if (function.identifier(), index) in slots:
                _drop_transposes(function, value)
    for value in weights:
        _write_transposed(graph, value, (sources or {}).get(value.name or ""), float32)
    return tuple(sorted(value.name or "" for value in weights))


def _transposable(graph: ir.Graph, slots: set[Slot]) -> list[ir.Value]:
    """The main graph's weights every use of which is a ``Transpose`` feeding ``MatMul`` s or
    a call's input in ``slots``."""
    found = []
    for value in graph.initializers.values():
        uses = list(value.uses())
        if is_weight(value) and uses and all(
                node.graph is graph and (weight_use(node, i) == "NK"
                                         or (callee(node), i) in slots)
                for node, i in uses):
            found.append(value)
    return found


def _kept(function: ir.Function, index: int, calls: list, layouts: dict[Slot, str],
          weights: set[ir.Value]) -> bool:
    """Whether a slot still holds: every call passes a weight transposed (from the main
    graph) or a slot's input (from a function), and every use of the input wants it
    (``layouts``: each slot, ``"NK"``)."""
    for container, node in calls:
        if isinstance(container, ir.Graph):
            if node.inputs[index] not in weights:
                return False
        elif not passes_weight(container, node, index, layouts, _any_weight):
            return False
    return input_layout(function, index, layouts) == "NK"


def _any_weight(value: ir.Value | None, layout: str) -> bool:
    """Whether the quantizer's analysis may take ``value`` as a weight in ``layout``: any
    2-D float initializer (nothing is quantized here, no block has to fit)."""
    return is_weight(value)


def _drop_transposes(container: "ir.Graph | ir.Function", value: ir.Value) -> None:
    """``value`` arrives ``[in, out]``: each ``Transpose`` of it goes, its ``MatMul`` s
    reading ``value`` (a call passes it on as it is)."""
    for node, index in list(value.uses()):
        if weight_use(node, index) == "NK":
            ir.convenience.replace_all_uses_with(node.outputs[0], value)
            container.remove(node, safe=True)


def _write_transposed(graph: ir.Graph, value: ir.Value, source: Any, float32: bool) -> None:
    """The weight ``value`` written ``[in, out]`` (computed when written), its
    ``Transpose`` s in the main graph dropped."""
    tensor = value.const_value
    assert tensor is not None
    out, into = tensor.shape
    name = value.name or ""

    def values() -> ir.Tensor:
        weight = weight_values(tensor, source)
        return ir.Tensor(_transposed(weight, float32), name=name)

    dtype = ir.DataType.FLOAT if float32 else tensor.dtype
    value.const_value = ir.LazyTensor(values, dtype, ir.Shape((into, out)), name=name)
    value.shape = ir.Shape((into, out))
    _drop_transposes(graph, value)


def _transposed(weight: Any, float32: bool) -> Any:
    """A 2-D torch tensor or array transposed (and converted after: half the bytes moved
    across the cache lines), as an array."""
    import numpy as np
    import torch

    if not isinstance(weight, torch.Tensor):
        weight = torch.from_numpy(np.asarray(weight))
    weight = weight.t().contiguous()
    return (weight.to(torch.float32) if float32 else weight).numpy()


__all__ = ["transpose_weights"]
