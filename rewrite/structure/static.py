"""What would stop a static-shape compiler (NPU stacks: QNN, QEfficient's, Intel's NPU
plugin) in an ONNX model: ``rewrite check-static MODEL.onnx``.

Each :class:`Obstacle` names the node, the function it is in (or the main graph) and why:

* data-dependent shapes or control flow: ``NonZero``, ``If``, ``Loop``, ``Scan``, ``Unique``;
* a shape read at run time: ``Shape`` / ``Size`` (a ``Reshape`` or ``Expand`` fed from it
  depends on the input's size), a ``Reshape`` / ``Expand`` / ``Tile`` / ``Slice`` /
  ``ConstantOfShape`` / ``Range`` whose shape or bounds input is not a constant;
* a reduction whose axes are an input that is not a constant;
* a graph input, output or value whose shape is not all numbers after ONNX shape inference
  (symbolic or unknown dimensions; main graph only: onnx infers no function body on its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from attrs import frozen

DATA_DEPENDENT = frozenset({"NonZero", "If", "Loop", "Scan", "Unique", "NonMaxSuppression"})
RUN_TIME_SHAPE = frozenset({"Shape", "Size"})
SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Range": 0,
                "Slice": 1}
"""op -> the first input that must be a constant (Slice: starts, ends, axes, steps)."""
REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                        "ReduceSumSquare"})


@frozen
class Obstacle:
    """One thing a static compiler would reject."""

    where: str
    """``main graph`` or ``function DOMAIN::NAME``."""
    node: str
    op: str
    why: str

    def render(self) -> str:
        return f"{self.where}: {self.node} ({self.op}): {self.why}"


def static_obstacles(path: str | Path) -> list[Obstacle]:
    """The obstacles of the model at ``path`` (external data is not read)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    found = list(_symbolic_values(model))
    found += _in_nodes("main graph", model.graph.node,
                       {i.name for i in model.graph.initializer})
    for function in model.functions:
        found += _in_nodes(f"function {function.domain}::{function.name}", function.node,
                           set())
    return found


def _in_nodes(where: str, nodes, constants: set[str]) -> list[Obstacle]:
    """Obstacles among ``nodes``; ``constants``: names known to be constant (initializers,
    ``Constant`` outputs, and what is computed from constants alone)."""
    constants = set(constants)
    found = []
    for node in nodes:
        name = node.name or f"<{node.op_type}>"
        inputs = [i for i in node.input if i]
        if node.op_type == "Constant" or (inputs and all(i in constants for i in inputs)
                                          and node.op_type not in RUN_TIME_SHAPE):
            constants.update(node.output)
        if node.op_type in DATA_DEPENDENT:
            found.append(Obstacle(where, name, node.op_type, "data-dependent shape or "
                                  "control flow"))
        elif node.op_type in RUN_TIME_SHAPE:
            found.append(Obstacle(where, name, node.op_type, "reads a shape at run time"))
        elif node.op_type in SHAPE_INPUTS:
            first = SHAPE_INPUTS[node.op_type]
            loose = [i for i in node.input[first:] if i and i not in constants]
            if loose:
                found.append(Obstacle(where, name, node.op_type, "its shape input "
                                      f"{loose[0]} is computed at run time"))
        elif node.op_type in REDUCTIONS and len(node.input) > 1 and node.input[1] \
                and node.input[1] not in constants:
            found.append(Obstacle(where, name, node.op_type,
                                  f"its axes ({node.input[1]}) are not a constant"))
    return found


def _symbolic_values(model) -> Iterator[Obstacle]:
    """Main-graph inputs, outputs and inferred values with a dimension that is not a
    number."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference itself failed: say so once
        yield Obstacle("main graph", "<shape inference>", "-", "ONNX shape inference fails")
        return
    graph = inferred.graph
    for kind, values in (("input", graph.input), ("output", graph.output),
                         ("value", graph.value_info)):
        for value in values:
            if not value.type.HasField("tensor_type"):
                continue
            dims = value.type.tensor_type.shape.dim
            loose = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
            if loose or not value.type.tensor_type.HasField("shape"):
                yield Obstacle("main graph", value.name, kind,
                               f"dimension {loose[0] if loose else 'unknown'} is not a number")
