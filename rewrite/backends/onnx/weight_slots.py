"""Where a model's weights are read as ``MatMul`` weights, through its functions.

A weight reaches a ``MatMul`` in the main graph as an initializer, or inside a function as
one of its inputs (a decoder layer's, passed on to the attention's or the MLP's function).
:func:`weight_slots` finds the function inputs that carry only weights, each with the
layout every use wants: ``"KN"`` (``MatMul(x, W)``, or GPT-2's plain ``Gemm``), ``"NK"``
(``MatMul(x, Transpose(W))``: a Linear's ``[out, in]`` weight) or ``"rows"`` (a ``Gather``'s
table); the largest set where either every call is in the main graph and passes a weight
(an *entry*) or every call is in a function and passes an input of it in the set
(*inner*). The int4 quantizer (:mod:`rewrite.backends.onnx.quantize`) and the weights
written ``[in, out]`` (:mod:`rewrite.backends.onnx.transposed`) both rewrite what it finds.
"""

from __future__ import annotations

from typing import Callable, Iterator

import onnx_ir as ir

FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
"""The weights' float types."""

FunctionId = tuple[str, str, str]
Slot = tuple[FunctionId, int]
"""A function's input, by position."""
Container = "ir.Graph | ir.Function"


def containers(model: ir.Model) -> Iterator[Container]:
    yield model.graph
    yield from model.functions.values()


def top(container: Container) -> ir.Graph:
    return container if isinstance(container, ir.Graph) else container.graph


def callee(node: ir.Node) -> FunctionId:
    return (node.domain, node.op_type, node.overload)


def call_sites(model: ir.Model, functions: dict[FunctionId, ir.Function]
                ) -> tuple[dict[FunctionId, list[tuple[Container, ir.Node]]], set[FunctionId]]:
    """Each function's calls (with the graph or function they are in), and the functions
    also called from a subgraph (``If``, ``Loop``: their inputs are not quantized)."""
    calls: dict[FunctionId, list[tuple[Container, ir.Node]]] = {f: [] for f in functions}
    opaque: set[FunctionId] = set()
    for container in containers(model):
        graph = top(container)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            fid = callee(node)
            if fid not in functions:
                continue
            if node.graph is graph:
                calls[fid].append((container, node))
            else:
                opaque.add(fid)
    return calls, opaque


def weight_use(node: ir.Node, index: int) -> str | None:
    """``"KN"``: the use is a MatMul's weight operand; ``"NK"``: a ``Transpose`` whose every
    use is one (a Linear's weight); ``"rows"``: a ``Gather``'s table, rows taken (an
    embedding's); else None."""
    if node.op_type == "MatMul" and node.domain == "" and index == 1:
        return "KN"
    if node.op_type == "Gather" and node.domain == "" and index == 0:
        axis = node.attributes.get("axis")
        return "rows" if axis is None or axis.as_int() == 0 else None
    if node.op_type == "Gemm" and node.domain == "" and index == 1 and _plain_gemm(node):
        return "KN"  # GPT-2's Conv1D: x @ W + b, W [in, out]
    if node.op_type != "Transpose" or node.domain != "" or index != 0:
        return None
    perm = node.attributes.get("perm")
    output = node.outputs[0]
    if perm is None or list(perm.as_ints()) != [1, 0] or output.is_graph_output():
        return None
    uses = list(output.uses())
    if uses and all(u.op_type == "MatMul" and u.domain == "" and i == 1 for u, i in uses):
        return "NK"
    return None


def _plain_gemm(node: ir.Node) -> bool:
    """A ``Gemm`` that is ``A @ B + C`` (no transposes, factors of 1)."""
    def attribute(name: str, default: float) -> float:
        found = node.attributes.get(name)
        return default if found is None else found.value
    return (attribute("transA", 0) == 0 and attribute("transB", 0) == 0
            and attribute("alpha", 1.0) == 1.0 and attribute("beta", 1.0) == 1.0)


def use_layout(node: ir.Node, index: int, slots: dict[Slot, str]) -> str | None:
    """The layout a use wants (see :func:`weight_use`; a call: its callee input's)."""
    layout = weight_use(node, index)
    if layout is None:
        layout = slots.get((callee(node), index))
    return layout


def input_layout(function: ir.Function, index: int, slots: dict[Slot, str]) -> str | None:
    """The one layout every use of the function's input wants, or None."""
    value = function.inputs[index]
    uses = list(value.uses())
    if not uses or value.is_graph_output():
        return None
    layouts = {use_layout(node, i, slots) if node.graph is function.graph else None
               for node, i in uses}
    return layouts.pop() if len(layouts) == 1 and None not in layouts else None


def is_weight(value: ir.Value | None) -> bool:
    """A 2-D float initializer of the main graph with its tensor."""
    tensor = value.const_value if value is not None and value.is_initializer() else None
    return (tensor is not None and tensor.dtype in FLOATS and len(tensor.shape) == 2
            and all(isinstance(d, int) and d > 0 for d in tensor.shape))


def weight_slots(model: ir.Model, functions: dict[FunctionId, ir.Function],
                       calls: dict, opaque: set[FunctionId],
                       fits: Callable[[ir.Value | None, str], bool]) -> dict[Slot, str]:
    """Function inputs to quantize, with their layout: the largest set where every use
    wants one layout and either every call is in the main graph and passes a weight that
    ``fits`` it (an entry: the function dequantizes) or every call is in a function and
    passes an input of it in the set (inner: it receives the dequantized ``[K, N]``
    weight; never an embedding's table, which is dequantized by rows gathered)."""
    slots: dict[Slot, str] = {}
    changed = True
    while changed:  # grow: inputs used only as weights, inner functions first
        changed = False
        for fid, function in functions.items():
            if fid in opaque or not calls[fid]:
                continue
            for index in range(len(function.inputs)):
                layout = input_layout(function, index, slots)
                if (fid, index) not in slots and layout is not None:
                    slots[(fid, index)] = layout
                    changed = True
    changed = True
    while changed:  # shrink: a call that passes no weight, calls from both kinds of places
        changed = False
        for (fid, index) in list(slots):
            sites = calls[fid]
            main = [isinstance(c, ir.Graph) for c, _ in sites]
            layout = slots[(fid, index)]
            ok = (all(main) or (not any(main) and layout != "rows")) and all(
                passes_weight(container, node, index, slots, fits)
                for container, node in sites)
            if ok and input_layout(functions[fid], index, slots) == slots[(fid, index)]:
                continue
            del slots[(fid, index)]
            changed = True
    return slots


def passes_weight(container: Container, node: ir.Node, index: int,
                   slots: dict[Slot, str], fits: Callable[[ir.Value | None, str], bool]
                   ) -> bool:
    arg = node.inputs[index] if index < len(node.inputs) else None
    if isinstance(container, ir.Graph):
        return fits(arg, slots[(callee(node), index)])
    if arg is None or not arg.is_graph_input():
        return False
    position = list(container.inputs).index(arg)
    return (container.identifier(), position) in slots
