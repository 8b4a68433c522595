"""The per-body decomposition's shortcuts (rewrite/_private/torch_exporter.py: lazy graph
modules, type promotion reading invoke_subgraph calls' values from meta, repeated calls
recorded without dispatching them, the fake-tensor cache off) change nothing: the same
decomposed graphs, node values and ONNX model as torch's plain passes."""

from __future__ import annotations

import contextlib

import onnx_ir as ir
import pytest
import torch
from torch.onnx._internal.exporter import _fx_passes

import rewrite
from rewrite._private import torch_exporter as torch_private
from rewrite.backends.onnx.lowering._invoke_subgraph import rebuild
from tests.onnx_fixtures import GPT2_RULES, assert_matches_eager


def _graphs(decomposed) -> list:
    """Every module's graph, and per node its value and metadata keys. Not compared, as the
    repeated calls' shortcut leaves them out: a placeholder's ``requires_grad`` and
    ``seq_nr`` (the placeholders only repeated calls read keep the program's values, make_fx's
    are detached copies), a call's ``eager_input_vals`` (copies of its operands' values for
    Inductor's stride checks)."""
    def val(n):
        v = n.meta.get("val")
        return str(v.detach() if n.op == "placeholder" and isinstance(v, torch.Tensor) else v)

    def keys(n):
        left_out = {"placeholder": {"seq_nr"}}.get(n.op, set())
        if n.target is torch.ops.higher_order.invoke_subgraph:
            left_out = {"eager_input_vals"}
        return sorted(k for k in n.meta if k not in left_out)

    return [(name, str(module.graph),
             [(n.name, val(n), str(n.meta.get("tensor_meta")), keys(n))
              for n in module.graph.nodes])
            for name, module in decomposed.graph_module.named_modules()]


@pytest.fixture
def plain(monkeypatch):
    """torch's passes as they are: eager graph modules, the type promotion pass as is, every
    call traced through make_fx's dispatch, the fake mode's dispatch cache on."""
    def use():
        monkeypatch.setattr(torch_private, "uncached", lambda mode: contextlib.nullcontext())
        monkeypatch.setattr(torch_private, "recording_apis", lambda: None)
        monkeypatch.setattr(torch_private, "lazy_graph_modules", contextlib.nullcontext)
        monkeypatch.setattr(torch_private, "_promote_types",
                            _fx_passes.insert_type_promotion_nodes)
    return use


def test_decomposition_equals_torchs_passes(gpt2_program, plain):
    program, _ = rebuild(gpt2_program, rewrite.apply(GPT2_RULES, gpt2_program).tree)
    assert sum(n.target is torch.ops.higher_order.invoke_subgraph
               for n in program.graph.nodes) == 2
    repeated, deferred = torch_private.repeated_calls(program.graph_module)
    assert len(repeated) == 1 and len(deferred) == 12  # the second call, its weights
    tables = torch_private.lowering_tables()
    fast = torch_private.decompose(program, tables)
    fast_model = ir.to_proto(torch_private.translate(fast, tables))
    plain()
    slow = torch_private.decompose(program, tables)
    assert _graphs(fast) == _graphs(slow)
    assert fast_model == ir.to_proto(torch_private.translate(slow, tables))


def test_lowering_equals_eager(gpt2_model, gpt2_program):
    lowered = rewrite.apply(GPT2_RULES, gpt2_program).to_onnx()
    assert_matches_eager(lowered, gpt2_model)


def test_a_number_minus_a_tensor_of_another_dtype_lowers_with_eagers_values_and_dtype():
    """``1.0 - mask`` on an int64 mask (XLNet): torch's decomposition of ``aten.rsub`` gives
    ``aten.sub.Tensor(1.0, mask)``, on which torch.onnx's type promotion failed (no overload
    of ``aten.sub`` takes a number first); the number is a 0-d tensor of the result's dtype,
    so every mix of dtypes keeps eager's values and dtype (a float16 tensor stays float16)."""
    import numpy as np

    from tests.onnx_fixtures import checked_proto, run_onnx

    class Differences(torch.nn.Module):
        def forward(self, mask, ints, halves, floats):
            return (1.0 - mask, 2 - ints, 0.5 - halves, 3 - floats, 1.5 - ints,
                    torch.rsub(floats, 2.0, alpha=3))

    args = (torch.tensor([[1, 0, 1]]), torch.tensor([5, -2], dtype=torch.int32),
            torch.tensor([1.5, 2.25], dtype=torch.float16), torch.tensor([0.25, 4.0]))
    model = rewrite.export(Differences(), args, rules="modularize")
    checked_proto(model)
    for got, expected in zip(run_onnx(model, args), Differences()(*args), strict=True):
        assert got.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(got, expected.numpy())
