"""The names of ``torch.export.Dim``\\ s as the ONNX model's symbolic dimensions.

``torch.export`` names every dynamic size after a symbol of its own (``s0``, ``s53``); a user
who wrote ``dynamic_shapes={"input_ids": {0: Dim("batch_size")}}`` expects ``batch_size`` in
the ONNX model, as ``torch.onnx.export`` gives. :func:`dim_names` maps each symbol a named
``Dim`` stands for to its name, reading the exported program's inputs; :func:`rename_dims`
writes the names into every shape of the model (graph, subgraphs and functions), inside
expressions too (``s0 + s70`` -> ``past_sequence_length + sequence_length``). Sizes given as
``Dim.DYNAMIC`` / ``Dim.AUTO`` have no name and keep their symbol.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch


def dim_names(program: "torch.export.ExportedProgram", dynamic_shapes: Any) -> dict[str, str]:
    """``{symbol: name}`` for the named ``Dim``\\ s of ``dynamic_shapes`` (the spec given to
    ``torch.export.export``, or one of the same form with names, ``str``, where the export
    had to take ``Dim.DYNAMIC``); empty when the spec does not line up with the program's
    inputs, one per tensor, or names nothing."""
    specs = list(_axes(dynamic_shapes))
    tensors = _user_input_shapes(program)
    if dynamic_shapes is None or len(specs) != len(tensors):
        return {}
    names: dict[str, str] = {}
    for shape, axes in zip(tensors, specs):
        for axis, dim in _items(axes):
            name = dim if isinstance(dim, str) else getattr(dim, "__name__", None)
            if shape is None or not isinstance(name, str) or axis >= len(shape):
                continue
            symbol = _symbol(shape[axis])
            if symbol is not None:
                names.setdefault(symbol, name)
    return names


def _axes(spec: Any) -> Iterator[Any]:
    """The per-tensor axis specs of a ``dynamic_shapes`` tree, in the inputs' flat order."""
    if spec is None or _is_axes(spec):
        yield spec
    elif isinstance(spec, dict):
        for value in spec.values():
            yield from _axes(value)
    elif isinstance(spec, (list, tuple)):
        for value in spec:
            yield from _axes(value)
    else:
        yield spec


def _is_axes(spec: Any) -> bool:
    """Whether ``spec`` describes one tensor: ``{axis: Dim}`` or ``[Dim | None, ...]``."""
    if isinstance(spec, dict):
        return bool(spec) and all(isinstance(k, int) for k in spec)
    return isinstance(spec, (list, tuple)) and all(
        v is None or isinstance(v, (int, str)) or hasattr(v, "__name__") or _is_hint(v)
        for v in spec)


def _is_hint(value: Any) -> bool:
    return type(value).__name__ == "_DimHint"


def _items(axes: Any) -> list[tuple[int, Any]]:
    if isinstance(axes, dict):
        return list(axes.items())
    if isinstance(axes, (list, tuple)):
        return list(enumerate(axes))
    return []


def _user_input_shapes(program: "torch.export.ExportedProgram") -> list[tuple | None]:
    """The shape of each user input of ``program`` (None for a non-tensor input)."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    shapes: list[tuple | None] = []
    for name in program.graph_signature.user_inputs:
        value = placeholders[name].meta.get("val") if name in placeholders else None
        shapes.append(tuple(value.shape) if hasattr(value, "shape") else None)
    return shapes


def _symbol(size: Any) -> str | None:
    """The symbol of a dynamic size that is one symbol (``s0``), else None."""
    node = getattr(size, "node", None)
    expr = getattr(node, "expr", None)
    return str(expr) if getattr(expr, "is_Symbol", False) else None


def rename_dims(model: "ir.Model", names: dict[str, str]) -> None:
    """Replace each symbol of ``names`` by its name in every symbolic dimension of ``model``,
    in place (longest symbols first, whole words only: ``s1`` is not part of ``s17``)."""
    import onnx_ir as ir

    if not names:
        return
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(symbol)}(?!\w)"
                                  for symbol in sorted(names, key=len, reverse=True)))
    for value in _values(model):
        shape = value.shape
        if shape is None or not any(isinstance(d, ir.SymbolicDim) and d.value for d in shape):
            continue
        dims = [pattern.sub(lambda m: names[m[0]], d.value)
                if isinstance(d, ir.SymbolicDim) and d.value else d for d in shape]
        value.shape = ir.Shape(dims)


def _values(model: "ir.Model") -> Iterator["ir.Value"]:
    """Every value of ``model``: inputs, outputs, initializers and node outputs of its graph,
    subgraphs and functions."""
    graphs = [*model.graphs(), *(g for f in model.functions.values()
                                 for g in (f.graph, *f.graph.subgraphs()))]
    seen: set[int] = set()
    for graph in graphs:
        for value in (*graph.inputs, *graph.initializers.values(),
                      *(v for node in graph for v in node.outputs)):
            if id(value) not in seen:
                seen.add(id(value))
                yield value
