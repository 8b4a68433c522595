"""The fast subset of the model zoo (tools/zoo.py; ``make zoo`` runs all of it; marked slow:
``make test-all`` and CI run it): real architectures lowered with modularize and a blocks
rule, checked against eager in ONNX (full checker, onnxruntime) and FX, one function per
distinct block body; the same from the program's ``.pt2``."""

from __future__ import annotations

import pytest

from tools.zoo import OK, body_key, check
from tools.zoo_models import FAST, entry


@pytest.mark.slow  # the families of the zoo
@pytest.mark.parametrize("name", FAST)
def test_zoo_model(name):
    row = check(entry(name), timing=False)
    assert row.result == OK, row
    assert row.pt2 == OK, row  # the same checks on the program read back from its .pt2
    functions, blocks = map(int, row.functions.split("/"))
    assert 1 <= functions < blocks


@pytest.mark.slow
def test_t5_converts_although_torch_onnx_export_cannot():
    """T5's program has in-place ops; torch.onnx.export fails on it (a view of a
    non-contiguous tensor while decomposing, torch 2.13), the per-body path lowers its
    functional form: equal to eager in ONNX and FX, one function per distinct block."""
    row = check(entry("t5"), timing=False)
    assert row.result == OK, row
    functions, blocks = map(int, row.functions.split("/"))
    assert 1 <= functions <= blocks


def test_equal_bodies_have_equal_keys():
    import onnx_ir as ir

    text = """
    <ir_version: 10, opset_import: ["" : 20, "f" : 1]>
    g (float[2] x) => (float[2] y) { a = f.F(x)  b = f.G(a)  y = Add(a, b) }
    <domain: "f", opset_import: ["" : 20]> F (u) => (v) { w = Relu(u)  v = Neg(w) }
    <domain: "f", opset_import: ["" : 20]> G (p) => (q) { r = Relu(p)  q = Neg(r) }
    """
    model = ir.from_onnx_text(text)
    f, g = model.functions.values()
    assert body_key(f) == body_key(g)
    g[1].op_type = "Abs"
    assert body_key(f) != body_key(g)
