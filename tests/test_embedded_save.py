"""A model with its weights embedded is written holding each weight once
(``rewrite.backends.onnx.embedded``): the same bytes as ``ir.save``, at the memory of one
weight, not of the model twice."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from rewrite.backends.onnx import embedded
from rewrite.backends.onnx.embedded import save_embedded

WEIGHTS = 8
ROWS, COLUMNS = 512, 512  # 1 MB of float32 each


def _model() -> ir.Model:
    """A chain of MatMuls over large float32 weights (arrays and lazy tensors), an int4 one
    made when written, small initializers, metadata and a doc string on a weight, and a
    node with a subgraph holding its own weight."""
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, ROWS]))
    graph = ir.Graph([x], [], nodes=[], name="main", opset_imports={"": 21})
    last = x
    for n in range(WEIGHTS):
        array = rng.standard_normal((ROWS, COLUMNS), dtype=np.float32)
        if n % 2:
            tensor = ir.LazyTensor(lambda a=array: ir.Tensor(a), ir.DataType.FLOAT,
                                   ir.Shape(array.shape), name=f"w{n}")
        else:
            tensor = ir.Tensor(array, name=f"w{n}", doc_string=f"weight {n}",
                               metadata_props={"layer": str(n)})
        weight = ir.Value(name=f"w{n}", const_value=tensor, type=ir.TensorType(tensor.dtype),
                          shape=tensor.shape)
        graph.register_initializer(weight)
        node = ir.node("MatMul", [last, weight])
        graph.append(node)
        last = node.outputs[0]
    codes = rng.integers(-8, 8, (ROWS, COLUMNS), dtype=np.int8)
    q = ir.LazyTensor(lambda: ir.Tensor(codes, dtype=ir.DataType.INT4), ir.DataType.INT4,
                      ir.Shape(codes.shape), name="q")
    small = ir.Tensor(np.arange(4, dtype=np.int64), name="axes")
    for tensor in (q, small):
        graph.register_initializer(ir.Value(name=tensor.name, const_value=tensor,
                                            type=ir.TensorType(tensor.dtype),
                                            shape=tensor.shape))
    inner = ir.Tensor(rng.standard_normal((256, 256), dtype=np.float32), name="inner")
    branch = ir.Graph([], [], nodes=[], name="branch")
    constant = ir.node("Constant", [], attributes={"value": inner})
    branch.append(constant)
    branch.outputs.append(constant.outputs[0])
    condition = ir.node("If", [ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL),
                                        shape=ir.Shape([]))],
                        attributes={"then_branch": branch, "else_branch": branch})
    graph.inputs.append(condition.inputs[0])
    graph.append(condition)
    graph.outputs.extend([last, condition.outputs[0]])
    return ir.Model(graph, ir_version=10, producer_name="test", doc_string="a model")


def test_the_same_bytes_as_ir_save(tmp_path):
    model = _model()
    ir.save(model, tmp_path / "expected.onnx")
    save_embedded(model, tmp_path / "written.onnx")
    assert (tmp_path / "written.onnx").read_bytes() == (tmp_path / "expected.onnx").read_bytes()
    loaded = {t.name: t for t in onnx.load(str(tmp_path / "written.onnx")).graph.initializer}
    for name in ("w0", "w1"):
        assert np.array_equal(onnx.numpy_helper.to_array(loaded[name]),
                              model.graph.initializers[name].const_value.numpy())
    # the model is left as it was: its weights are its own again
    assert all(not isinstance(v.const_value, embedded._Hollow)
               for v in model.graph.initializers.values())


def test_one_weight_at_a_time(tmp_path):
    """ir.save holds the whole model's serialized bytes (8 MB of weights here) at once;
    the embedded writer at most a weight and the skeleton."""
    model = _model()
    tracemalloc.start()
    try:
        save_embedded(model, tmp_path / "written.onnx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    weight = ROWS * COLUMNS * 4
    assert peak < 3 * weight, peak


def test_a_weight_writing_other_than_its_size_is_an_error(tmp_path):
    model = _model()
    tensor = model.graph.initializers["w0"].const_value
    model.graph.initializers["w0"].const_value = ir.LazyTensor(
        lambda: ir.Tensor(np.zeros((ROWS, COLUMNS - 1), dtype=np.float32)),
        ir.DataType.FLOAT, tensor.shape, name="w0")
    with pytest.raises(AssertionError, match="w0: wrote"):
        save_embedded(model, tmp_path / "written.onnx")


def test_a_text_format_is_written_as_ir_save_writes_it(tmp_path):
    model = _model()
    ir.save(model, tmp_path / "expected.json")
    save_embedded(model, tmp_path / "written.json")
    assert (tmp_path / "written.json").read_bytes() == (tmp_path / "expected.json").read_bytes()
