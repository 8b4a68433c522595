"""Lowering step 1: the export is not optimized; each distinct function body is optimized
once after outlining (and the main graph), and bodies that became equal are merged."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir
import pytest

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from tools import models
from tests.onnx_fixtures import (
    assert_matches_eager,
    checked_proto,
    function_names,
    GPT2_RULES,
    runs,
    top_calls,
)


def _sizes(model) -> dict[str, int]:
    return {f.name: len(f) for f in model.functions.values()}


@pytest.fixture(scope="module")
def gpt2_unoptimized(gpt2_lowered):
    result, _ = gpt2_lowered
    return lower(result, OnnxOptions(optimize=False)).model


def test_functions_are_optimized_not_inlined(gpt2_lowered, gpt2_unoptimized, gpt2_model):
    _, lowering = gpt2_lowered
    model = lowering.model
    assert top_calls(model)["GPT2Block"] == 2
    optimized, plain = _sizes(model), _sizes(gpt2_unoptimized)
    assert optimized.keys() == plain.keys()
    assert all(optimized[name] <= plain[name] for name in plain)
    assert optimized["GPT2Attention"] < plain["GPT2Attention"]
    assert_matches_eager(model, gpt2_model)
    checked_proto(model)


def test_each_body_has_its_constants_once(gpt2_lowered):
    # common subexpressions are eliminated inside function bodies too
    model = gpt2_lowered[1].model
    for function in model.functions.values():
        values = Counter(
            (str(n.attributes["value"].value.dtype), n.attributes["value"].value.tobytes())
            for n in function if n.op_type == "Constant" and "value" in n.attributes
        )
        assert all(count == 1 for count in values.values()), function.name
        assert not any(n.op_type == "Identity" for n in function), function.name


def test_unoptimized_functions_on_request(gpt2_unoptimized, gpt2_model):
    checked_proto(gpt2_unoptimized)
    assert_matches_eager(gpt2_unoptimized, gpt2_model)
    assert top_calls(gpt2_unoptimized)["GPT2Block"] == 2


@pytest.fixture(scope="module")
def noops():
    triple = models.two_noops()
    return triple, rewrite.apply(rewrite.parse_rules("group class *NoOp"), models.export(triple))


def test_bodies_equal_after_optimizing_share_one_function(noops):
    triple, result = noops
    lowering = lower(result, OnnxOptions(constants="embed"))  # no scalar variants
    model = lowering.model
    checked_proto(model)
    assert_matches_eager(model, triple)
    # a and b share NoOp; c's body differs: NoOp_2 before merging, renumbered to NoOp_1
    assert top_calls(model) == {"NoOp": 2, "NoOp_1": 1}
    assert function_names(model) == {"NoOp": 1, "NoOp_1": 1}
    assert {g: f[1] for g, f in lowering.outlined.function_of.items()} == {
        "a": "NoOp", "b": "NoOp", "c": "NoOp_1"}
    assert [f[1] for f in lowering.outlined.functions] == ["NoOp", "NoOp_1"]


def test_scalar_variants_are_merged_before_optimizing(noops):
    """a (``* 1``) and c (``* -1``) differ in a scalar: one function, the factor an attribute
    (merged before the optimizer could fold a's ``* 1`` away); b's ``+ 0`` is folded away."""
    triple, result = noops
    lowering = lower(result)
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, triple)
    assert {g: f[1] for g, f in lowering.outlined.function_of.items()} == {
        "a": "NoOp", "b": "NoOp_1", "c": "NoOp"}
    factors = [n.attributes["mul"].value for n in lowering.model.graph if n.op_type == "NoOp"]
    assert factors == [1.0, -1.0]


def test_without_optimizing_the_bodies_differ(noops):
    triple, result = noops
    # (embed: under the default policy a's "* 1" and c's "* -1" would share a function with
    # the factor as an attribute)
    model = lower(result, OnnxOptions(optimize=False, constants="embed")).model
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NoOp": 1, "NoOp_1": 1, "NoOp_2": 1}


def test_calls_with_other_shapes_do_not_share_a_folded_body():
    triple = models.two_shapes()
    model = lower(rewrite.apply(rewrite.parse_rules("group class *Flatten"),
                                models.export(triple))).model
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"Flatten_1": 1, "Flatten_2": 1}  # Flatten: an operator
    shapes = {tuple(f.inputs[0].shape) for f in model.functions.values()}
    assert shapes == {(2, 3, 4), (2, 6, 5)}
    # each body was folded for its own shape: the output shapes differ
    outputs = sorted(tuple(f.outputs[0].shape) for f in model.functions.values())
    assert outputs == [(2, 12), (2, 30)]
    # and the shape the export computed with Concat etc. was folded into a constant
    reshaped = set()
    for function in model.functions.values():
        (reshape,) = [n for n in function if n.op_type == "Reshape"]
        reshaped.add(tuple(ir.convenience.get_const_tensor(reshape.inputs[1]).numpy().tolist()))
    assert reshaped == {(2, 12), (2, 30)}


def test_body_nodes_keep_their_names_and_metadata(gpt2_lowered):
    model = gpt2_lowered[1].model
    (attention,) = [f for f in model.functions.values() if f.name == "GPT2Attention"]
    gemms = [n for n in attention if n.op_type in ("Gemm", "MatMul")]
    assert gemms
    for node in gemms:
        assert node.name.startswith("node_")
        scopes = node.metadata_props["pkg.torch.onnx.name_scopes"]
        assert "h.0.attn" in scopes  # the first block's body stands for all of them
        assert "GPT2Attention" in node.metadata_props["namespace"]


def test_an_optimizer_failure_names_the_function_and_the_way_around(gpt2_lowered, monkeypatch):
    from rewrite.backends.onnx.finishing import _optimize as optimize_module
    from rewrite.errors import LibraryError

    def broken(model, **_):
        raise RuntimeError("folding exploded")

    monkeypatch.setattr(optimize_module, "optimize_ir", broken)
    with pytest.raises(LibraryError, match=r"onnxscript \S+ failed optimizing function "
                       r"pkg\.[a-z]+::\w+ \(lower without its optimizer: rewrite apply "
                       r"--no-optimize.*: RuntimeError: folding exploded"):
        lower(gpt2_lowered[0])


# --- unnamed body nodes (OnnxOptions.body_node_names) -----------------------------------------


def _ort_node_names(model: ir.Model, tmp_path) -> list[str]:
    """The node names of the graph onnxruntime runs (its functions inlined, no optimizing)."""
    import onnx
    import onnxruntime as ort

    source, dumped = tmp_path / "model.onnx", tmp_path / "ort.onnx"
    ir.save(model, str(source))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(dumped)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return [node.name for node in onnx.load(str(dumped)).graph.node]


def test_body_nodes_unnamed_on_request(gpt2_lowered, gpt2_model, tmp_path):
    result, named = gpt2_lowered
    model = lower(result, OnnxOptions(body_node_names=False)).model
    checked_proto(model)
    assert_matches_eager(model, gpt2_model)
    assert _sizes(model) == _sizes(named.model)  # the same functions, only unnamed
    assert all(not node.name for f in model.functions.values()
               for node in ir.traversal.RecursiveGraphIterator(f))
    assert all(node.name for node in model.graph)  # the main graph keeps its names
    # what it is for: onnxruntime names the nodes it inlines from named bodies
    # _inlfunc_<function>_<node>, and leaves those of unnamed bodies unnamed
    assert any(n.startswith("_inlfunc_") for n in _ort_node_names(named.model, tmp_path))
    assert not any(n.startswith("_inlfunc_") for n in _ort_node_names(model, tmp_path))


def test_body_nodes_unnamed_on_the_command_line(run_cli, gpt2_lowered, tmp_path):
    import torch

    result, _ = gpt2_lowered
    pt2 = tmp_path / "gpt2.pt2"
    torch.export.save(result.tree.graph.source, str(pt2))
    rules = GPT2_RULES
    outputs = {}
    for flags in ((), ("--no-body-node-names",)):
        out = tmp_path / f"out{len(flags)}.onnx"
        r = run_cli("apply", rules, pt2, "-o", out, *flags)
        assert r.code == 0, r.err
        outputs[flags] = ir.load(str(out))
    named, unnamed = outputs.values()
    assert all(node.name for f in named.functions.values() for node in f)
    assert not any(node.name for f in unnamed.functions.values() for node in f)


# --- what onnxruntime fuses after inlining -----------------------------------------------------


def test_rms_norm_body_fuses_in_onnxruntime(llama_lowered, llama_model, tmp_path):
    """The RMSNorm body divides by the root (torch's ``rsqrt`` is lowered to ``Sqrt`` +
    ``Reciprocal``; a ``Mul`` by it is written as a ``Div``): onnxruntime, inlining the
    functions, fuses every call into one ``SimplifiedLayerNormalization``, and the model
    still matches eager."""
    import onnx
    import onnxruntime as ort

    _, lowering = llama_lowered
    model = lowering.model
    (norm,) = [f for fid, f in model.functions.items() if fid[1] == "LlamaRMSNorm"]
    ops = Counter(node.op_type for node in norm)
    assert ops["Reciprocal"] == 0 and ops["Div"] == 1, ops
    source, dumped = tmp_path / "model.onnx", tmp_path / "ort.onnx"
    ir.save(model, str(source))
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(dumped)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    fused = Counter(node.op_type for node in onnx.load(str(dumped)).graph.node)
    assert fused["SimplifiedLayerNormalization"] == runs(model)["LlamaRMSNorm"], fused
    assert fused["Reciprocal"] == 0
    assert_matches_eager(model, llama_model)


def test_key_transpose_is_one_transpose_onnxruntime_folds(tmp_path):
    """torchlib's ``K^T`` (``Reshape`` to 3-D, ``Transpose``, ``Reshape`` back, on the
    decode model's dynamic shapes) is written as one ``Transpose`` of the last two
    dimensions, which onnxruntime folds into the attention's ``MatMul`` (``FusedMatMul``
    with ``transB``); the export still matches eager (it is checked before it is written).
    With the attention unfused (``fuse_attention=False``; fused, one ``Attention`` reads
    ``K`` as it is)."""
    import onnx
    import onnxruntime as ort

    from tests import checkpoints

    folder = checkpoints.write("llama", tmp_path / "ckpt")
    out = tmp_path / "model.onnx"
    model = rewrite.export(folder, output=out, cache="kv", fuse_attention=False)
    (attention,) = [f for fid, f in model.functions.items() if fid[1] == "LlamaAttention"]
    perms = [tuple(node.attributes.get_ints("perm")) for node in attention
             if node.op_type == "Transpose"]
    assert (0, 2, 1) not in perms and perms.count((0, 1, 3, 2)) == 1, perms
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    fused = [node for node in onnx.load(options.optimized_model_filepath).graph.node
             if node.op_type == "FusedMatMul"
             and any(a.name == "transB" and a.i == 1 for a in node.attribute)]
    assert len(fused) == runs(model)["LlamaAttention"]
