"""The shipped rule files on random-weight models of their family: the group tree they make.

Each model has 2 layers; the expected trees are written out in full so a change in the rules,
the grouping or the frontend that moves a group shows up here. With the ONNX backend, the
layers must also dedupe into one function per class.
"""

from __future__ import annotations

import pytest

import rewrite


def shape(group: rewrite.Group) -> tuple:
    """(key, class name, function name, children shapes) of a group."""
    cls = group.call.class_name if group.call else None
    return (group.key, cls, group.function_name, tuple(shape(c) for c in group.children))


def tree_shape(result: rewrite.Result) -> list[tuple]:
    return [shape(g) for g in result.tree.root.children]


def origins(result: rewrite.Result) -> set[str]:
    return {g.origin.split("/")[-1] for g in result.tree.groups()}


def llama_layer(i: int) -> tuple:
    p = f"layers.{i}"
    return (p, "LlamaDecoderLayer", "LlamaDecoderLayer", (
        (f"{p}.input_layernorm", "LlamaRMSNorm", "LlamaRMSNorm", ()),
        (f"{p}.self_attn", "LlamaAttention", "LlamaAttention", ()),
        (f"{p}.post_attention_layernorm", "LlamaRMSNorm", "LlamaRMSNorm", ()),
        (f"{p}.mlp", "LlamaMLP", "LlamaMLP", ()),
    ))


def test_llama_rules(llama_program):
    result = rewrite.apply("llama", llama_program)
    assert tree_shape(result) == [
        ("embed_tokens", "Embedding", "TokenEmbedding", ()),
        ("rotary_emb", "LlamaRotaryEmbedding", "LlamaRotaryEmbedding", ()),
        llama_layer(0),
        llama_layer(1),
        ("norm", "LlamaRMSNorm", "LlamaRMSNorm", ()),
    ]
    assert result.warnings == ()  # every rule matches something
    assert {g.domain for g in result.tree.groups()} == {"pkg.transformers", "pkg.torch"}
    # projections stay flat inside attention / MLP
    attn = result.tree.find("layers.0/layers.0.self_attn")
    names = {result.tree.graph.nodes[i].name for i in attn.nodes}
    assert any("linear" in n for n in names)


def bert_layer(i: int) -> tuple:
    p = f"encoder.layer.{i}"
    return (p, "BertLayer", "BertLayer", (
        (f"{p}.attention", "BertAttention", "BertAttention", (
            (f"{p}.attention.self", "BertSelfAttention", "BertSelfAttention", ()),
        )),
        (f"{p}.intermediate", "BertIntermediate", "BertIntermediate", ()),
        (f"{p}.output", "BertOutput", "BertOutput", ()),
    ))


def test_bert_rules(bert_program):
    result = rewrite.apply("bert", bert_program)
    assert tree_shape(result) == [
        ("embeddings", "BertEmbeddings", "BertEmbeddings", ()),
        bert_layer(0),
        bert_layer(1),
        ("pooler", "BertPooler", "BertPooler", ()),
    ]
    assert result.warnings == ()
    assert len(origins(result)) == 7  # each of the 7 rules made a group


def gpt2_block(i: int) -> tuple:
    return (f"h.{i}", "GPT2Block", "GPT2Block", (
        (f"h.{i}.attn", "GPT2Attention", "GPT2Attention", ()),
        (f"h.{i}.mlp", "GPT2MLP", "GPT2MLP", ()),
    ))


def test_gpt2_rules(gpt2_program):
    result = rewrite.apply("gpt2", gpt2_program)
    assert tree_shape(result) == [
        ("wte", "Embedding", "Embedding_wte", ()),
        ("wpe", "Embedding", "Embedding_wpe", ()),
        gpt2_block(0),
        gpt2_block(1),
        ("ln_f", "LayerNorm", "FinalLayerNorm", ()),
    ]


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_layers_share_one_onnx_function(family, llama_program, bert_program):
    from rewrite.backends.onnx import summarize

    program = llama_program if family == "llama" else bert_program
    model = rewrite.apply(family, program).to_onnx()
    runs = {fid[1]: s.instances for fid, s in summarize(model).items()}
    if family == "llama":
        assert runs["LlamaDecoderLayer"] == 2
        assert runs["LlamaAttention"] == 2 and runs["LlamaMLP"] == 2
        assert runs["LlamaRMSNorm"] == 5  # two per layer and the final norm, one function
    else:
        assert runs["BertLayer"] == 2 and runs["BertSelfAttention"] == 2
        assert runs["BertIntermediate"] == 2 and runs["BertOutput"] == 2
    assert not any(name.endswith("_1") for name in runs), runs  # no duplicate bodies
