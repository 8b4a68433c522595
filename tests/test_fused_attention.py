"""``rewrite export`` writes each layer function's attention as one opset-23 ``Attention``.

Small random checkpoints (tests/checkpoints.py): the attention function's body holds one
``Attention`` on the grouped key / value heads (no ``Expand`` of the cache, no ``Softmax``),
the cache's past in and present out, and two ``RotaryEmbedding``, on the 3-D projections (no
``Reshape`` / ``Transpose`` to heads), once in the whole file (one function per layer class,
called by every layer); the model imports opset 23 and passes onnx's full check; prefill and
3 decode steps in onnxruntime equal eager within 1e-4 (one row left-padded), sliding windows
included. Where the op cannot say what the model computes (Gemma-2 caps its attention logits
with ``tanh`` before the mask), the body keeps its unfused attention; a rotary whose caches'
halves are not proven equal stays unfused. ``--unfused-attention``
keeps torch.onnx's lowering everywhere.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest

import rewrite
from tests import checkpoints
from tests.test_checkpoint_export import LAYER_CLASSES, Recorder, decode_and_compare


def _export(family: str, tmp_path: Path, config: dict | None = None, **options
            ) -> tuple[Path, Path, ir.Model]:
    """``family``'s checkpoint (its config.json updated with ``config``) exported with
    ``options``, its prefill and decode steps checked equal to eager within 1e-4."""
    folder = checkpoints.write(family, tmp_path / "checkpoint")
    if config:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    model = rewrite.export(folder, output=out, progress=Recorder(), **options)
    errors = decode_and_compare(folder, out)
    assert max(errors) < 1e-4, errors
    return folder, out, model


def _ops(out: Path) -> tuple[Counter, dict[str, Counter], Counter]:
    """Op types of the main graph, of each function (by name), and how often each function
    is called anywhere in the file as written."""
    proto = onnx.load(str(out), load_external_data=False)
    onnx.checker.check_model(str(out), full_check=True)  # its data file beside it
    bodies = {f.name: Counter(n.op_type for n in f.node) for f in proto.functions}
    calls = Counter(n.op_type for graph in [proto.graph.node, *(f.node for f in proto.functions)]
                    for n in graph if n.op_type in bodies)
    return Counter(n.op_type for n in proto.graph.node), bodies, calls


def _assert_fused(out: Path, model: ir.Model, family: str, flat: bool = True) -> None:
    """One ``Attention`` and two ``RotaryEmbedding`` in one body; ``flat``: on the 3-D
    projections."""
    main, bodies, calls = _ops(out)
    attention = [name for name, ops in bodies.items() if ops["Attention"]]
    assert len(attention) == 1, bodies  # one body, not one per layer
    body = bodies[attention[0]]
    assert body["Attention"] == 1 and not body["Softmax"] and not body["Expand"], body
    assert main["Attention"] == 0 and sum(ops["Attention"] for ops in bodies.values()) == 1
    assert calls[LAYER_CLASSES[family]] == checkpoints.LAYERS  # every layer calls one body
    assert body["RotaryEmbedding"] == 2 and not body["Neg"] and not body["Expand"], body
    assert bool(body["Reshape"]) is not flat, body
    assert model.opset_imports[""] == 23
    node = next(n for f in model.functions.values() for n in f if n.op_type == "Attention")
    assert len(node.inputs) == 6 and len(node.outputs) == 3  # the cache in and out
    # [batch, sequence, heads * head] projections: two KV heads for four query heads
    heads = [node.attributes.get_int(n) for n in ("q_num_heads", "kv_num_heads")]
    assert heads == ([4, 2] if flat else [None, None])


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen3", marks=pytest.mark.slow)])
def test_attention_is_one_opset23_node_per_body_and_decodes_equal_eager(family, tmp_path):
    """Llama; Qwen3, whose query / key norms read the 4-D heads (so its attention takes
    4-D heads): fused once, equal to eager."""
    _, out, model = _export(family, tmp_path)
    _assert_fused(out, model, family, flat=family != "qwen3")


@pytest.mark.slow  # a tiny Mistral exported, prefill + 3 decode steps past its window
def test_a_sliding_window_stays_the_models_mask(tmp_path):
    """Mistral with a window of 3 tokens (a prompt of 5, then 3 steps): the mask the model
    computes is the fused op's mask, so the window holds in prefill and decode."""
    _, out, model = _export("mistral", tmp_path, {"sliding_window": 3})
    _assert_fused(out, model, "mistral")


@pytest.mark.slow  # a tiny Gemma-2 exported, prefill + 3 decode steps
def test_logits_capped_before_the_mask_keep_the_unfused_attention(tmp_path):
    """Gemma-2 caps its attention logits (``tanh``) before adding the (sliding-window) mask;
    ``Attention``'s ``softcap`` caps after the mask: its attention stays unfused (its rotary
    is fused), and equal to eager."""
    _, out, model = _export("gemma2", tmp_path)
    main, bodies, _ = _ops(out)
    assert not any(ops["Attention"] for ops in [main, *bodies.values()])
    body = bodies["Gemma2Attention"]
    assert body["Tanh"] and body["Softmax"] and body["RotaryEmbedding"] == 2, body


@pytest.mark.slow
def test_unfused_attention_keeps_torch_onnx_lowering(tmp_path, run_cli):
    """``--unfused-attention``: no ``Attention`` anywhere, the grouped heads expanded, opset
    as exported; equal to eager."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    r = run_cli("export", folder, "-o", out, "--unfused-attention")
    assert r.code == 0, r.err
    main, bodies, _ = _ops(out)
    assert not any(ops["Attention"] for ops in [main, *bodies.values()])
    assert bodies["LlamaAttention"]["Softmax"] == 1 and bodies["LlamaAttention"]["Expand"] == 2
    imports = onnx.load(str(out), load_external_data=False).opset_import
    assert next(i.version for i in imports if i.domain == "") < 23
    assert max(decode_and_compare(folder, out)) < 1e-4


@pytest.mark.slow
def test_int4_dequantizes_and_attends_in_one_body(tmp_path):
    """``--precision int4``: the layer's bodies dequantize its four weights (q / k / v and
    gate / up packed; ``DequantizeLinear`` with ``block_size``, valid at opset 23) and attend
    with one ``Attention``; the export's own check (eager on the same weights dequantized,
    prefill and a decode step) passes."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    progress = Recorder()
    model = rewrite.export(folder, output=out, precision="int4", block_size=16,
                           progress=progress)
    assert "max |difference|" in progress.text
    _, bodies, _ = _ops(out)
    assert sum(ops["DequantizeLinear"] for ops in bodies.values()) == 4, bodies
    assert bodies["LlamaAttention"]["Attention"] == 1 and not bodies["LlamaAttention"]["Softmax"]
    assert model.opset_imports[""] == 23


def _rotary_model(doubled: bool) -> ir.Model:
    """A main graph computing ``cos`` / ``sin`` of ``Concat(f, f)`` (``doubled``) or of
    ``Concat(f, g)``, and a function rotating ``x`` ``[1, 2, S, 8]`` by them as transformers
    writes it, called once."""
    from onnx import TensorProto, helper

    ints = {n: helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in
            (("one", 1), ("zero", 0), ("four", 4), ("end", 8), ("last", -1))}
    body = [helper.make_node("Constant", [], [n], value=t) for n, t in ints.items()]
    body += [helper.make_node("Unsqueeze", ["cos", "one"], ["c4"]),
             helper.make_node("Unsqueeze", ["sin", "one"], ["s4"]),
             helper.make_node("Slice", ["x", "zero", "four", "last"], ["x1"]),
             helper.make_node("Slice", ["x", "four", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["n"]),
             helper.make_node("Concat", ["n", "x1"], ["r"], axis=-1),
             helper.make_node("Mul", ["x", "c4"], ["a"]),
             helper.make_node("Mul", ["r", "s4"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    function = helper.make_function("test", "Rotate", ["x", "cos", "sin"], ["y"], body,
                                    [helper.make_opsetid("", 20)])
    second = "f" if doubled else "g"
    nodes = [helper.make_node("Concat", ["f", second], ["e"], axis=-1),
             helper.make_node("Cos", ["e"], ["cos"]), helper.make_node("Sin", ["e"], ["sin"]),
             helper.make_node("Rotate", ["x", "cos", "sin"], ["y"], domain="test")]
    floats = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (
        ("x", [1, 2, "S", 8]), ("f", [1, "S", 4]), ("g", [1, "S", 4]))]
    graph = helper.make_graph(nodes, "g", floats, [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "S", 8])])
    proto = helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 20), helper.make_opsetid("test", 1)])
    model = ir.from_proto(onnx.shape_inference.infer_shapes(proto))
    body_values = {v.name: v for n in model.functions[("test", "Rotate", "")] for v in n.outputs}
    for name, shape in (("c4", [1, 1, "S", 8]), ("s4", [1, 1, "S", 8])):
        body_values[name].shape = ir.Shape(shape)
    inputs = model.functions[("test", "Rotate", "")].inputs
    for value, shape in zip(inputs, ([1, 2, "S", 8], [1, "S", 8], [1, "S", 8])):
        value.shape = ir.Shape(shape)
    return model


@pytest.mark.parametrize("doubled", [True, False])
def test_a_rotary_is_fused_only_where_its_caches_halves_are_equal(doubled):
    """``RotaryEmbedding`` reads half of ``cos`` / ``sin``: it replaces the rotation only
    where every call's caches are ``Cos`` / ``Sin`` of frequencies concatenated with
    themselves (the main graph's, through the call)."""
    from rewrite.backends.onnx.finishing._rotary import call_sites, fuse_rotary

    model = _rotary_model(doubled)
    fid = ("test", "Rotate", "")
    assert fuse_rotary(model, fid, call_sites(model)) == int(doubled)
    ops = Counter(n.op_type for n in model.functions[fid])
    assert (ops["RotaryEmbedding"], ops["Neg"]) == ((1, 0) if doubled else (0, 1))
