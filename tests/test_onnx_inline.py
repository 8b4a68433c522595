"""The per-body lowering's inliner (backends/onnx/inline.py: onnx_ir's InlinePass with its
unique-name search made linear) gives what the pass gives as it is: the same nodes, names,
attributes and metadata, in the same order; onnx_ir's function is restored afterwards."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import InlinePass
from onnx_ir.passes.common import inliner as onnx_ir_inliner

from rewrite._private.onnx_ir_inline import inline_functions, linear_unique_names

MODEL = """
<ir_version: 10, opset_import: ["" : 20, "local" : 1]>
main (float[2,3] x) => (float[2,3] y, float[2,3] z) {
    t = local.Block <alpha: float = 0.5> (x)
    u = local.Block (t)
    v = Relu (u)
    y = local.Block <alpha: float = 2.0> (v)
    z = Identity (t)
}
<domain: "local", opset_import: ["" : 20, "local" : 1]>
Block <alpha: float = 1.0> (a) => (b) {
    c = local.Scale <factor: float = @alpha> (a)
    t = Add (c, a)
    b = local.Scale (t)
}
<domain: "local", opset_import: ["" : 20]>
Scale <factor: float = 3.0> (a) => (b) {
    f = Constant <value_float: float = @factor> ()
    b = Mul (a, f)
}
"""


def _model() -> ir.Model:
    model = ir.from_onnx_text(MODEL)
    for i, node in enumerate(model.graph):  # unnamed nodes, and names the bodies' clash with
        node.name = f"n{i}" if i % 2 else ""
        node.metadata_props["call"] = str(i)
    for function in model.functions.values():
        for i, node in enumerate(function):
            node.name = f"n{i}"
            node.metadata_props["inner"] = node.op_type
    return model


def _signature(model: ir.Model) -> list:
    return [(n.name, n.domain, n.op_type, [v.name if v is not None else None for v in n.inputs],
             [o.name for o in n.outputs], dict(n.metadata_props),
             {k: (a.type, a.value) for k, a in n.attributes.items()}) for n in model.graph]


def test_inliner_equals_onnx_ir_inline_pass():
    ours, theirs = _model(), _model()
    original = onnx_ir_inliner._make_unique_name
    with linear_unique_names() as replaced:
        assert replaced and onnx_ir_inliner._make_unique_name is not original
    assert onnx_ir_inliner._make_unique_name is original
    inline_functions(ours)
    assert onnx_ir_inliner._make_unique_name is original
    InlinePass()(theirs)
    assert len([n for n in ours.graph if n.op_type == "Mul"]) == 6  # 3 Block calls x 2 Scale
    assert not ours.functions and not theirs.functions
    assert _signature(ours) == _signature(theirs)
    assert [o.name for o in ours.graph.outputs] == [o.name for o in theirs.graph.outputs]
    proto = ir.to_proto(ours)
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    got = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    want = ort.InferenceSession(ir.to_proto(_model()).SerializeToString()).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
