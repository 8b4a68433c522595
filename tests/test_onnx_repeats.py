"""Repeated blocks (``backends.onnx.repeats``) and the ONNX frontend's columns.

``Repeats.find`` may only say "same" where :meth:`Keyer.body` keys are equal (a false "same"
would call the wrong function): bodies that differ in one attribute, one input or one
constant's content are told apart, ``0.0`` and ``-0.0`` included. The frontend's columns equal
those derived from its (lazily built) nodes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from rewrite.backends.onnx.outlining._repeats import Reference, Repeats
from rewrite.backends.onnx.outlining._body_keys import Keyer
from rewrite.frontends.onnx.graph import CLASS_HIERARCHY, NAME_SCOPES, from_onnx_model
from rewrite.ir.stacks import columns_of

IDENTITY = ("pkg", "Block")


def _block(x: ir.Value, attrs: dict) -> tuple[list[ir.Node], list[ir.Value]]:
    """``Constant -> Mul(x, c) -> Transpose``; the Transpose's output is returned."""
    tensor = attrs.get("tensor", ir.tensor(np.array([1.0, 2.0], dtype=np.float32)))
    const = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)])
    mul = ir.Node("", "Mul", [x, const.outputs[0]] if not attrs.get("swap") else
                  [const.outputs[0], x])
    extra = [ir.AttrFloat32("alpha", attrs.get("alpha", 0.0))]
    last = ir.Node("", "Transpose", [mul.outputs[0]],
                   [ir.AttrInt64s("perm", attrs.get("perm", [1, 0]))] + extra)
    return [const, mul, last], [last.outputs[0]]


def _find(repeats: Repeats, attrs: dict) -> Reference | None:
    x = ir.Value(name="x")
    members, outputs = _block(x, attrs)
    return repeats.find(IDENTITY, members, [x], {}, outputs)


@pytest.fixture
def repeats() -> Repeats:
    repeats = Repeats(Keyer())
    x = ir.Value(name="x")
    members, outputs = _block(x, {})
    body = repeats.snapshot(IDENTITY, members, [x], {}, outputs)
    function = ir.Function("pkg", "Block", graph=ir.Graph([], [], nodes=[]), attributes=())
    repeats.add(Reference(body, function, [0, 1, 2], [0], [0]))
    return repeats


def test_an_equal_body_is_found(repeats):
    assert _find(repeats, {}) is not None


@pytest.mark.parametrize("attrs", [
    {"perm": [0, 1]},
    {"alpha": -0.0},
    {"alpha": 1.0},
    {"swap": True},
    {"tensor": ir.tensor(np.array([1.0, 3.0], dtype=np.float32))},
    {"tensor": ir.tensor(np.array([1.0, 2.0], dtype=np.float64))},
])
def test_a_body_that_differs_anywhere_is_not_found(repeats, attrs):
    assert _find(repeats, attrs) is None


def test_frontend_columns_equal_those_of_its_nodes():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    nodes = []
    value = x
    for k, (path, cls) in enumerate([("a", "m.A"), ("a", "m.A"), ("b", "m.B"), ("a", "m.A")]):
        node = ir.Node("", "Relu", [value], name=f"n{k}")
        node.metadata_props[NAME_SCOPES] = repr(["", path, f"relu_{k}"])
        node.metadata_props[CLASS_HIERARCHY] = repr(["m.Root", cls, "aten.relu.default"])
        nodes.append(node)
        value = node.outputs[0]
    nodes.append(ir.Node("", "Neg", [value], name="bare"))  # no metadata: unknown stack
    graph = ir.Graph([x], [nodes[-1].outputs[0]], nodes=nodes)
    built = from_onnx_model(ir.Model(graph, ir_version=10))
    derived = columns_of(list(built.nodes))
    columns = built.columns
    for ids, table in (("stack_id", "stacks"), ("target_id", "targets"), ("tags_id", "tag_sets")):
        assert ([getattr(columns, table)[i] for i in getattr(columns, ids)]
                == [getattr(derived, table)[i] for i in getattr(derived, ids)])
    for name in ("is_io", "input_start", "input_index"):
        assert np.array_equal(getattr(columns, name), getattr(derived, name))
    assert [c.key for c in built.calls] == ["a", "b", "a@1"]
    assert built.nodes[-2].stack is None and built.nodes[1].stack[0].key == "a"
    assert built.nodes[4].stack[0].key == "a@1" and built.root_class == "m.Root"
