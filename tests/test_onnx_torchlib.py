"""torchlib's registry built without translating every function's signature
(:mod:`rewrite._private.torchlib`) is torch's ``from_torchlib``."""

from __future__ import annotations

import torch
from onnxscript._framework_apis.torch_2_5 import get_torchlib_ops
from torch.onnx._internal.exporter._registration import ONNXRegistry

from rewrite._private import torchlib
from rewrite._private import torch_exporter
from rewrite._private.torch_exporter import lowering_tables, target_opset
from tests.onnx_fixtures import assert_matches_eager


def _entries(registry) -> list:
    return [(key, [(m.onnx_function, m.fx_target, m.is_complex, m.is_custom, m.signature)
                   for m in metas])
            for key, metas in registry.functions.items()]


def test_ops_are_onnxscripts_with_the_same_domains():
    want = [(m.qualified_name, m.function, m.domain, m.name, m.is_complex)
            for m in get_torchlib_ops()]
    got = [(m.qualified_name, m.function, m.domain, m.name, m.is_complex)
           for m in torchlib.torchlib_ops()]
    assert got == want


def test_registry_equals_from_torchlib():
    opset = target_opset()
    fast, slow = torchlib.from_torchlib(opset), ONNXRegistry.from_torchlib(opset_version=opset)
    assert fast.opset_version == slow.opset_version
    assert _entries(fast) == _entries(slow)


def test_lowering_uses_it_and_equals_eager(gpt2_model, gpt2_lowered):
    # built now, as the slow one: ops registered with torch since the process built its
    # registry (importing transformers' ONNX exporter registers quantized_decomposed ops) would
    # otherwise differ
    torch_exporter._registry_and_tables.cache_clear()
    registry = lowering_tables()[0]
    slow = ONNXRegistry.from_torchlib(opset_version=registry.opset_version)
    hop = torch.ops.higher_order.invoke_subgraph
    assert registry.is_registered(hop)  # torch.onnx 2.9 has no translation: rewrite's is added
    theirs = dict(_entries(slow))
    kept = [(key, [m for m in metas if m in theirs.get(key, [])])
            for key, metas in _entries(registry)]
    assert [entry for entry in kept if entry[1]] == _entries(slow)  # torchlib's, in order
    own = {key: [m for m in metas if m not in theirs.get(key, [])]
           for key, metas in _entries(registry)}
    own = {key: metas for key, metas in own.items() if metas}
    # rewrite's: the call of a layer's function (complex operands too), and unsqueeze of a
    # complex tensor (Llama 4's rotary embedding)
    assert set(own) <= {hop, "aten::unsqueeze"}, own
    assert [m[2] for m in own["aten::unsqueeze"]] == [True]
    assert any(m[2] for m in own[hop])
    _, lowering = gpt2_lowered
    assert lowering.path == "per-body"
    assert_matches_eager(lowering.model, gpt2_model)
