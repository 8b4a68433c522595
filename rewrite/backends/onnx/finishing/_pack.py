"""Projections of one input packed into one ``MatMul`` per function body.

A decoder layer multiplies its normed hidden state by the query, key and value weights (and
the MLP's by the gate and up weights): three (two) ``MatMul``, ``MatMulNBits`` once
onnxruntime fuses an int4 weight, per layer and token. :func:`pack_projections` writes each
such set of a body as one ``MatMul`` by the weights concatenated along their output
dimension, then one ``Split`` into the projections: fewer kernels per token, each a larger
product (the model builder packs q / k / v likewise).

A set: two or more ``MatMul`` of a body reading one input, each by a weight that arrives as
an input of the function (``[K, N]``, or a Linear's ``[N, K]`` through a ``Transpose``) and
is read only there, of one type and K, with a static N. Every call of the function must pass
those inputs as initializers of the main graph (the layer's call), or as inputs of the
calling function read only by that call (the attention inside the layer), packed the same
way up to the main graph; else the set stays as it is. The function then takes one packed
input in their place, at its end; each call in the main graph passes a
:class:`~rewrite.backends.onnx.packed.PackedWeight` of its weights (concatenated when it is
written). It runs once per distinct body (:class:`finishing._passes.PackProjections`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx.finishing._attention import _is, _stand_in
from rewrite.backends.onnx.finishing._rotary import Sites, call_sites
from rewrite.backends.onnx.packed import PackedWeight
from rewrite.backends.onnx.summary import FunctionId


@frozen
class _Set:
    """``MatMul`` nodes reading one input, each by a weight input of the function."""

    matmuls: tuple[ir.Node, ...]
    weights: tuple[ir.Value, ...]
    transposed: bool
    """The weights arrive ``[N, K]`` (a ``Transpose`` each before its ``MatMul``)."""


def pack_projections(model: ir.Model, fid: FunctionId) -> int:
    """Each set of function ``fid``'s body packed (the module docstring); how many."""
    packed = 0
    for found in _sets(model.functions[fid]):
        sites = call_sites(model)
        positions = _positions(model.functions[fid], found.weights)
        if not _liftable(model, sites, fid, positions, found.transposed):
            continue
        weight = _lift(model, sites, fid, positions, found.transposed)
        _rewrite(model.functions[fid].graph, found, weight)
        packed += 1
    return packed


def _sets(function: ir.Function) -> list[_Set]:
    """The sets of the body (the module docstring), in node order."""
    inputs = set(function.inputs)
    by_input: dict[tuple[ir.Value, bool], list[tuple[ir.Node, ir.Value]]] = {}
    for node in function.graph:
        if not _is(node, "MatMul") or node.inputs[0] is None or node.inputs[1] is None:
            continue
        weight, transposed = node.inputs[1], False
        made = weight.producer()
        if made is not None and _is(made, "Transpose") and tuple(
                made.attributes.get_ints("perm", ())) == (1, 0) and _only_use(
                made.outputs[0], node):
            weight, transposed = made.inputs[0], True
        if weight is None or weight not in inputs or not _only_use(
                weight, made if transposed else node) or not _static(weight, node):
            continue
        by_input.setdefault((node.inputs[0], transposed), []).append((node, weight))
    sets = []
    for (_, transposed), found in by_input.items():
        weights = [w for _, w in found]
        k = {w.shape[1 if transposed else 0] for w in weights}  # type: ignore[index]
        if len(found) > 1 and len(k) == 1 and len({w.dtype for w in weights}) == 1:
            sets.append(_Set(tuple(n for n, _ in found), tuple(weights), transposed))
    return sets


def _only_use(value: ir.Value, node: ir.Node) -> bool:
    uses = list(value.uses())
    return len(uses) == 1 and uses[0].node is node and not value.is_graph_output()


def _static(weight: ir.Value, matmul: ir.Node) -> bool:
    """A 2-D float weight of static dimensions, read as ``MatMul``'s second operand."""
    shape = weight.shape
    return (shape is not None and len(shape) == 2 and all(isinstance(d, int) for d in shape)
            and weight.dtype is not None and weight.dtype.is_floating_point()
            and matmul.inputs[1] is not None)


def _positions(function: ir.Function, values: Sequence[ir.Value]) -> tuple[int, ...]:
    inputs = list(function.inputs)
    return tuple(inputs.index(value) for value in values)


def _graph_of(model: ir.Model) -> dict[ir.Graph, FunctionId]:
    return {f.graph: fid for fid, f in model.functions.items()}


def _liftable(model: ir.Model, sites: Sites, fid: FunctionId, positions: tuple[int, ...],
              transposed: bool) -> bool:
    """Whether every call of ``fid`` passes packable weights at ``positions``."""
    if not sites.get(fid):
        return False
    owners = _graph_of(model)
    for call in sites[fid]:
        args = [call.inputs[p] if p < len(call.inputs) else None for p in positions]
        if any(arg is None for arg in args) or len(set(args)) != len(args):
            return False
        if call.graph is model.graph:
            if not _weights(args, transposed):  # type: ignore[arg-type]
                return False
            continue
        caller = owners.get(call.graph)  # type: ignore[arg-type]
        if caller is None or not all(arg.is_graph_input() and _only_use(arg, call)
                                     for arg in args):  # type: ignore[union-attr]
            return False
        inner = _positions(model.functions[caller], args)  # type: ignore[arg-type]
        if not _liftable(model, sites, caller, inner, transposed):
            return False
    return True


def _weights(args: Sequence[ir.Value], transposed: bool) -> bool:
    """2-D initializers with values, of one type and K."""
    tensors = [arg.const_value if arg.is_initializer() else None for arg in args]
    if any(t is None or len(t.shape) != 2 for t in tensors):
        return False
    k = {t.shape[1 if transposed else 0] for t in tensors}  # type: ignore[union-attr]
    return len(k) == 1 and len({t.dtype for t in tensors}) == 1  # type: ignore[union-attr]


def _lift(model: ir.Model, sites: Sites, fid: FunctionId, positions: tuple[int, ...],
          transposed: bool) -> ir.Value:
    """Function ``fid`` takes one packed input for its inputs at ``positions`` (at its
    end), each call passing it; that input."""
    function = model.functions[fid]
    olds = [function.inputs[p] for p in positions]
    axis = 0 if transposed else 1
    packed = ir.Value(name=packed_name([v.name or "" for v in olds]), type=olds[0].type,
                      shape=ir.Shape(_packed_shape([v.shape for v in olds], axis)))  # type: ignore[misc]
    owners = _graph_of(model)
    for call in list(sites[fid]):
        args = [call.inputs[p] for p in positions]
        if call.graph is model.graph:
            arg = _initializer(model.graph, args, axis)  # type: ignore[arg-type]
        else:
            caller = owners[call.graph]  # type: ignore[index]
            inner = _positions(model.functions[caller], args)  # type: ignore[arg-type]
            arg = _lift(model, sites, caller, inner, transposed)
        _reargue(call, positions, arg)
    for position in sorted(positions, reverse=True):
        function.inputs.pop(position)
    function.inputs.append(packed)
    return packed


def _packed_shape(shapes: Sequence[ir.Shape], axis: int) -> tuple[int, int]:
    total = sum(int(shape[axis]) for shape in shapes)
    first = shapes[0]
    return (total, int(first[1])) if axis == 0 else (int(first[0]), total)


def packed_name(names: Sequence[str]) -> str:
    """``a.q_proj.weight``, ``a.k_proj.weight`` -> ``a.q_proj+k_proj.weight``: the common
    prefix up to a dot, the common suffix from one, the rest joined by ``+``."""
    prefix = names[0][:len(_common([n for n in names]))]
    prefix = prefix[:prefix.rfind(".") + 1]
    suffix = _common([n[len(prefix):][::-1] for n in names])[::-1]
    suffix = suffix[suffix.find("."):] if "." in suffix else ""
    middles = [n[len(prefix):len(n) - len(suffix)] for n in names]
    return f"{prefix}{'+'.join(middles)}{suffix}"


def _common(names: Sequence[str]) -> str:
    first = names[0]
    size = 0
    while size < len(first) and all(len(n) > size and n[size] == first[size] for n in names):
        size += 1
    return first[:size]


def _initializer(graph: ir.Graph, args: Sequence[ir.Value], axis: int) -> ir.Value:
    """The main graph's packed initializer of ``args`` (made once), the ones it replaces
    dropped where nothing else reads them."""
    name = packed_name([arg.name or "" for arg in args])
    if name in graph.initializers:
        return graph.initializers[name]
    tensor = PackedWeight([arg.name or "" for arg in args],
                          [arg.const_value for arg in args], axis, name)  # type: ignore[misc]
    value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=tensor.shape,
                     const_value=tensor)
    graph.register_initializer(value)
    return value


def _reargue(call: ir.Node, positions: tuple[int, ...], packed: ir.Value) -> None:
    """``call``'s inputs at ``positions`` dropped, ``packed`` appended; initializers of the
    main graph nothing reads any more removed."""
    old = list(call.inputs)
    new = [v for i, v in enumerate(old) if i not in positions] + [packed]
    for index, value in enumerate(new):
        call.replace_input_with(index, value)
    call.resize_inputs(len(new))
    graph = call.graph
    for index in positions:
        value = old[index]
        if (value is not None and value.is_initializer() and not list(value.uses())
                and graph is not None and value.name in graph.initializers):
            del graph.initializers[value.name]


def _rewrite(graph: ir.Graph, found: _Set, weight: ir.Value) -> None:
    """The set's ``MatMul`` as one by ``weight`` (transposed first if the parts were), then
    a ``Split`` into their outputs."""
    first = found.matmuls[0]
    x = first.inputs[0]
    nodes = []
    if found.transposed:
        nodes.append(ir.Node("", "Transpose", (weight,), (ir.AttrInt64s("perm", (1, 0)),)))
        weight = nodes[-1].outputs[0]
    sizes = [int(w.shape[0 if found.transposed else 1]) for w in found.weights]  # type: ignore[index]
    split = ir.Node("", "Constant", (), (ir.AttrTensor("value", ir.tensor(
        np.array(sizes, dtype=np.int64))),))
    product = ir.Node("", "MatMul", (x, weight), name=first.name,
                      metadata_props=dict(first.metadata_props))
    parts = ir.Node("", "Split", (product.outputs[0], split.outputs[0]),
                    (ir.AttrInt64("axis", -1),), num_outputs=len(sizes))
    nodes += [split, product, parts]
    graph.insert_before(first, nodes)
    olds = [m.outputs[0] for m in found.matmuls]
    shape = olds[0].shape
    if shape is not None:
        product.outputs[0].shape = ir.Shape([*shape[:-1], sum(sizes)])
    product.outputs[0].type = olds[0].type
    for old, new in zip(olds, parts.outputs):
        _stand_in(old, new)
    transposes = [m.inputs[1].producer() for m in found.matmuls] if found.transposed else []
    graph.remove(list(found.matmuls), safe=True)
    graph.remove([t for t in transposes if t is not None], safe=True)
    graph.sort()
