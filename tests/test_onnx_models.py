"""ONNX backend on real models: valid, numerically equal to eager PyTorch, deduplicated.

For random-weight GPT-2, Llama, BERT and the hand-written shared/multi-output/buffer model:
the full ONNX checker passes, onnxruntime matches eager PyTorch within 1e-4, and the function
tree (which functions exist, who calls whom, how often) is the expected one.
"""

from __future__ import annotations

import re

import onnx_ir as ir
import torch

import rewrite
from rewrite.backends.onnx import OnnxOptions
from rewrite.backends.onnx.outlining._naming import GROUP_KEY, RULE_KEY
from rewrite.frontends.onnx.graph import NAMESPACE as NAMESPACE_KEY
from tests.onnx_fixtures import (
    assert_matches_eager,
    callees,
    checked_proto,
    function_names,
    runs,
    top_calls,
)


# --- GPT-2 -----------------------------------------------------------------------------------


def test_gpt2_is_valid_and_matches_eager(gpt2_lowered, gpt2_model):
    _, lowering = gpt2_lowered
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, gpt2_model)


def test_gpt2_one_block_function_called_twice(gpt2_lowered):
    _, lowering = gpt2_lowered
    model = lowering.model
    blocks = [f for f in model.functions if f[1].startswith("GPT2Block")]
    assert blocks == [("pkg.transformers", "GPT2Block", "")]
    assert top_calls(model)["GPT2Block"] == 2
    assert callees(model, "GPT2Block") == {"GPT2Attention": 1, "GPT2MLP": 1}
    assert function_names(model)["GPT2Attention"] == 1
    assert runs(model)["GPT2Attention"] == 2
    assert top_calls(model)["Embedding_wte"] == 1
    assert top_calls(model)["FinalLayerNorm"] == 1
    # the blocks' work is in the functions: the main graph keeps only glue
    assert len(model.graph) < 10


def test_gpt2_groups_match_the_fx_tree(gpt2_lowered):
    result, lowering = gpt2_lowered
    fx_ids = {g.id: g.function_name for g in result.tree.groups()}
    onnx_ids = {g.id: g.function_name for g in lowering.tree.groups()}
    # every group survives: the export is optimized after outlining, so the position
    # embedding (a Gather of constant positions) is not folded away before it is grouped
    assert onnx_ids == fx_ids
    assert lowering.outlined.function_of["wpe"] == ("pkg.torch", "Embedding_wpe", "")
    assert lowering.outlined.function_of["h.1"] == ("pkg.transformers", "GPT2Block", "")


def test_gpt2_call_nodes_record_rule_and_namespace(gpt2_lowered):
    result, lowering = gpt2_lowered
    calls = {n.name: n for n in lowering.model.graph if n.op_type == "GPT2Block"}
    assert set(calls) == {"h.0", "h.1"}
    group = result.tree.find("h.1")
    props = calls["h.1"].metadata_props
    assert props[RULE_KEY] == group.origin
    assert re.search(r"gpt2\.rules:\d+$", props[RULE_KEY])
    assert props[GROUP_KEY] == "h.1"
    assert props[NAMESPACE_KEY].endswith("h.1: transformers.models.gpt2.modeling_gpt2.GPT2Block")
    inner = [n for n in lowering.model.functions[("pkg.transformers", "GPT2Block", "")]
             if n.op_type == "GPT2Attention"]
    assert inner[0].metadata_props[GROUP_KEY] == "h.0/h.0.attn"


def test_gpt2_opset_imports_cover_every_domain(gpt2_lowered):
    _, lowering = gpt2_lowered
    model = lowering.model
    assert model.opset_imports["pkg.transformers"] == 1
    assert model.opset_imports["pkg.torch"] == 1
    for function in model.functions.values():
        used = {n.domain for n in function}
        assert used <= set(function.opset_imports), function.name
        if "" in used:
            assert function.opset_imports[""] == model.opset_imports[""]


def test_gpt2_weights_are_function_inputs(gpt2_lowered):
    _, lowering = gpt2_lowered
    model = lowering.model
    block = model.functions[("pkg.transformers", "GPT2Block", "")]
    names = [v.name for v in block.inputs]
    assert "attn.c_attn.weight" in names and "mlp.c_fc.weight" in names
    # every parameter is still one initializer of the main graph, read by the calls
    for name in ("h.0.attn.c_attn.weight", "h.1.attn.c_attn.weight", "h.1.mlp.c_proj.weight"):
        assert name in model.graph.initializers
    # no function holds a weight, or anything large, as a constant
    limit = OnnxOptions().constant_limit
    for function in model.functions.values():
        for node in function:
            if node.op_type == "Constant":
                assert node.attributes["value"].value.size <= limit


# --- Llama, BERT -----------------------------------------------------------------------------


def test_llama_is_valid_matches_eager_and_dedups(llama_lowered, llama_model):
    _, lowering = llama_lowered
    model = lowering.model
    checked_proto(model)
    assert_matches_eager(model, llama_model)
    assert [f[1] for f in model.functions if "DecoderLayer" in f[1]] == ["LlamaDecoderLayer"]
    assert top_calls(model)["LlamaDecoderLayer"] == 2
    assert callees(model, "LlamaDecoderLayer") == {
        "LlamaRMSNorm": 2, "LlamaAttention": 1, "LlamaMLP": 1,
    }
    # one RMSNorm function for the 4 layer norms and the final norm
    assert function_names(model)["LlamaRMSNorm"] == 1
    assert runs(model)["LlamaRMSNorm"] == 5
    assert top_calls(model)["LlamaRMSNorm"] == 1
    assert top_calls(model)["TokenEmbedding"] == 1


def test_bert_is_valid_matches_eager_and_dedups(bert_lowered, bert_model):
    _, lowering = bert_lowered
    model = lowering.model
    checked_proto(model)
    assert_matches_eager(model, bert_model)
    assert [f[1] for f in model.functions if f[1].startswith("BertLayer")] == ["BertLayer"]
    assert top_calls(model)["BertLayer"] == 2
    assert callees(model, "BertLayer") == {
        "BertAttention": 1, "BertIntermediate": 1, "BertOutput": 1,
    }
    assert callees(model, "BertAttention") == {"BertSelfAttention": 1}
    assert runs(model)["BertSelfAttention"] == 2
    assert top_calls(model)["BertEmbeddings"] == 1 and top_calls(model)["BertPooler"] == 1


# --- shared submodule, multi-output submodule, buffer -----------------------------------------


def test_shared_model_is_valid_and_matches_eager(shared_lowered, shared_model):
    _, lowering = shared_lowered
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, shared_model)


def test_shared_module_called_twice_is_two_calls_of_one_function(shared_lowered):
    _, lowering = shared_lowered
    model = lowering.model
    calls = {n.name: n for n in model.graph if n.domain.startswith("pkg.")}
    # shared (twice) and layers.0-2 are the same Sub: one function, five calls
    assert top_calls(model)["Sub_1"] == 5  # "Sub" is an ONNX operator's name: never a function's
    assert {"shared", "shared@1", "layers.0", "layers.1", "layers.2"} <= set(calls)
    assert calls["shared"].op_type == calls["shared@1"].op_type == "Sub_1"
    # the second call reads the first call's output
    assert calls["shared@1"].inputs[0] is calls["shared"].outputs[0]
    assert callees(model, "Sub_1") == {"Linear": 1}
    # a Linear of another shape is another function
    assert callees(model, "SplitHeads") == {"Linear_1": 1}


def test_multi_output_submodule_returns_both_values(shared_lowered):
    _, lowering = shared_lowered
    model = lowering.model
    heads = model.functions[("pkg.tools", "SplitHeads", "")]
    assert len(heads.outputs) == 2
    (call,) = [n for n in model.graph if n.op_type == "SplitHeads"]
    users = {u.node.op_type for out in call.outputs for u in out.uses()}
    assert {"Mul", "Add", "ReduceSum"} <= users


def test_buffer_stays_an_initializer(shared_lowered):
    _, lowering = shared_lowered
    assert "scale" in lowering.model.graph.initializers
    (mul,) = [n for n in lowering.model.graph if n.op_type == "Mul"]
    assert any(v is not None and v.name == "scale" for v in mul.inputs)


def test_to_onnx_returns_a_fresh_model_each_time(shared_program):
    import rewrite
    from tests.onnx_fixtures import MODULARIZE

    result = rewrite.apply(MODULARIZE, shared_program)
    first, second = result.to_onnx(), result.to_onnx()
    assert isinstance(first, ir.Model) and first is not second
    assert ir.to_proto(first).SerializeToString() == ir.to_proto(second).SerializeToString()


# --- function names that are ONNX operators' ---------------------------------------------------


class Add(torch.nn.Module):
    """A module class named like an ONNX operator, whose function has one input."""

    def forward(self, x):
        return x + 1.0


class Mul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.add = Add()

    def forward(self, x):
        return self.add(x) * 2.0


def test_a_class_named_like_an_operator_runs_in_onnxruntime():
    """onnxruntime takes a function named like an ONNX operator for it, whatever its domain, and
    crashes on a one-input ``Add`` or ``Mul``: such functions are named ``Add_1``, ``Mul_1``."""
    model = Mul()
    triple = (model, (torch.randn(2, 3),), {})
    lowered = rewrite.apply("modularize", torch.export.export(model, triple[1])).to_onnx()
    assert sorted(f.name for f in lowered.functions.values()) == ["Add_1"]
    checked_proto(lowered)
    assert_matches_eager(lowered, triple)
