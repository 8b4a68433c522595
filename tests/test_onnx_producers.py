"""Rules on the ONNX files people already have (issue 33), made by the real producers from tiny
random models (``tests/producers.py``; nothing downloaded):

* torch.onnx's TorchScript exporter (``dynamo=False``) on BERT, GPT-2 and a Whisper encoder;
* onnxruntime-genai's builder (a subprocess) on 4-layer Llama, Phi-3 and Qwen2, fp32 and int4;
* onnxruntime's transformer optimizer on that BERT (fused SkipLayerNormalization, Gelu);
* a dynamo export quantized by onnxruntime's ``MatMulNBitsQuantizer``.

Each is grouped by one path rule (a layer per call) and must give one function per distinct
layer body, called once per layer; the output is checked as the input is
(:func:`rewrite.frontends.onnx.check.check_onnx`: ops onnx has no schema for left out), loads in
onnxruntime and equals the input model there within 1e-5, and its weights are the input's (not
copied into the function bodies: initializers of the main graph, function inputs).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import rewrite
from rewrite.backends.onnx import save_onnx
from rewrite.frontends.onnx.check import check_onnx
from tests import producers
from tests.onnx_fixtures import ROOT, session

GENAI = [(arch, precision) for arch in ("llama", "phi3", "qwen2") for precision in ("fp32", "int4")]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Every producer's model, made once: name -> (model path, the layers' path glob)."""
    root = tmp_path_factory.mktemp("producers")
    out: dict[str, tuple[Path, str]] = {}
    for which in ("bert", "gpt2", "whisper"):
        path = root / f"{which}-ts.onnx"
        out[f"{which}-torchscript"] = (path, producers.torchscript_export(which, path))
    out["bert-optimized"] = (_optimized(out["bert-torchscript"][0], root), "bert.encoder.layer.*")
    runs = []
    for arch in ("llama", "phi3", "qwen2"):
        folder = producers.hf_checkpoint(arch, root / f"{arch}-hf")
        for precision in ("fp32", "int4"):
            runs.append((folder, root / f"{arch}-{precision}", precision))
            out[f"{arch}-{precision}"] = (root / f"{arch}-{precision}" / "model.onnx",
                                          "model.layers.*")
    producers.genai_build(runs, root / "cache")
    return out


def _optimized(path: Path, root: Path) -> Path:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=32,
                               opt_level=1)
    out = root / "bert-optimized.onnx"
    optimized.save_model_to_file(str(out))
    return out


def _outline(source: Path, rules: str, out: Path) -> rewrite.Result:
    """Group ``source`` by ``rules`` into ``out``; weights as external data when the input's
    are (genai's builder writes them so), else embedded."""
    result = rewrite.apply(rewrite.parse_rules(rules), source)
    external = source.with_name(source.name + ".data").exists()
    save_onnx(result, out, **({"external_data_threshold": 0} if external else {}))
    assert out.with_name(out.name + ".data").exists() == external
    return result


def _assert_same_in_onnxruntime(source: Path, output: Path) -> None:
    want_session, got_session = session(source), session(output)
    feeds = producers.feeds(want_session)
    want, got = want_session.run(None, feeds), got_session.run(None, feeds)
    assert [o.name for o in want_session.get_outputs()] == \
        [o.name for o in got_session.get_outputs()]
    for w, g in zip(want, got):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def _layer_calls(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if (n.domain, n.op_type, n.overload) in model.functions]


PRODUCED = ["bert-torchscript", "gpt2-torchscript", "whisper-torchscript", "bert-optimized",
            *[f"{a}-{p}" for a, p in GENAI]]


@pytest.mark.slow  # every producer's models (the torchscript exporter, genai's builder), made once
@pytest.mark.parametrize("name", PRODUCED)
def test_one_function_per_distinct_layer(made, name, tmp_path):
    source, layers = made[name]
    result = _outline(source, f"group path {layers}\n", tmp_path / "out.onnx")
    assert result.tree.graph.structure == "node names"
    assert not result.warnings
    groups = [g for g in result.tree.groups()]
    pattern = re.compile(layers.replace(".", r"\.").replace("*", r"\d+") + "$")
    assert groups and all(pattern.fullmatch(g.key) for g in groups)

    unchecked = check_onnx(tmp_path / "out.onnx")  # raises if the checker refuses it
    assert unchecked.ops == check_onnx(source).ops
    if _checks(source) and not unchecked.ops:  # the input passes the full checker: so
        onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)  # does the output
    _assert_same_in_onnxruntime(source, tmp_path / "out.onnx")

    model = ir.load(tmp_path / "out.onnx")
    calls = _layer_calls(model)
    assert sorted(n.name for n in calls) == sorted(g.key for g in groups)  # one call per layer
    bodies = Counter(n.op_type for n in calls)
    # identical layers share one function: in BERT, GPT-2 and Whisper every layer; genai's
    # first layer starts with a plain norm (the others add the residual in a SkipNorm) and
    # its layers.4 is the final norm alone
    genai = name.split("-")[0] in ("llama", "phi3", "qwen2")
    assert sorted(bodies.values()) == ([1, 1, 3] if genai else [4]), bodies
    # named after the module (no class): model.layers.0 -> layers, in domain pkg.local
    stem = layers.split(".")[-2]
    assert all(n.domain == "pkg.local" and re.fullmatch(rf"{stem}(_\d+)?", n.op_type)
               for n in calls), {(n.domain, n.op_type) for n in calls}
    _assert_weights_are_inputs(source, model)
    for function in model.functions.values():  # contrib ops' domains imported where used
        for node in function:
            assert node.domain in function.opset_imports


@pytest.mark.slow
def test_external_weights_embedded_when_small(made, tmp_path):
    """The builder writes its weights as external data; a small output embeds them (before,
    the output kept the input's relative location, a file its folder does not have)."""
    source, layers = made["llama-fp32"]
    result = rewrite.apply(rewrite.parse_rules(f"group path {layers}\n"), source)
    save_onnx(result, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
    onnx.load(str(tmp_path / "out.onnx"))  # every tensor readable from the file itself
    _assert_same_in_onnxruntime(source, tmp_path / "out.onnx")


def _checks(source: Path) -> bool:
    try:
        onnx.checker.check_model(str(source), full_check=True)
        return True
    except Exception:  # noqa: BLE001 - onnxruntime's ops, or the producer's own value_info
        return False


def _assert_weights_are_inputs(source: Path, model: ir.Model) -> None:
    """Every weight of the input is an initializer of the output's main graph, with the same
    bytes, and no function body holds a tensor of more than one element."""
    want = ir.load(source)
    for name, value in want.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or tensor.size <= 1 or tensor.dtype == ir.DataType.INT64:
            continue
        assert name in model.graph.initializers, name
        got = model.graph.initializers[name].const_value
        assert got.tobytes() == tensor.tobytes(), name
    for function in model.functions.values():
        for node in function:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    assert attr.value.size <= 1 or attr.value.dtype == ir.DataType.INT64, \
                        (function.name, node.name)


@pytest.mark.slow
def test_explain_says_where_structure_came_from(made):
    source, layers = made["llama-fp32"]
    rules = ROOT / "rules" / "llama.rules"
    done = subprocess.run([sys.executable, "-m", "rewrite", "explain", str(rules), str(source)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "module calls (from node names: paths, no classes)" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    # the check's one line (onnxruntime's ops) and one line for the six class rules
    assert sum("onnx.checker has no schema for" in line for line in warnings) == 1
    classless = [line for line in warnings if "no module classes" in line]
    assert len(classless) == 1
    assert re.search(r"\(5 rules: \S*llama.rules:10, \S*llama.rules:11, ", classless[0])
    assert "`group path model.layers.*`" in classless[0]
    assert not any("matches nothing" in line for line in warnings)
    done = subprocess.run([sys.executable, "-m", "rewrite", "explain", str(rules), str(source),
                           "--json"], capture_output=True, text=True)
    assert json.loads(done.stdout)["graph"]["structure"] == "node names"


@pytest.mark.slow
def test_suggest_writes_path_rules(made, tmp_path):
    source, _ = made["qwen2-fp32"]
    rules = tmp_path / "suggested.rules"
    done = subprocess.run([sys.executable, "-m", "rewrite", "suggest", str(source), "-o",
                           str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = rules.read_text()
    assert "group path model.layers.*  " in text
    assert "class" not in re.sub(r"#.*", "", text)
    result = rewrite.apply(rewrite.load_rules(rules), source)
    keys = {g.key for g in result.tree.groups()}
    assert {f"model.layers.{i}" for i in range(5)} <= keys


@pytest.mark.slow
def test_quantized_dynamo_export(tmp_path):
    """Every MatMulNBits of a dynamo export quantized after the fact is in the function of the
    module whose Linear it replaced (attention or MLP), not in the decoder layer."""
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from tools import models

    model, args, kwargs = models.llama(layers=2, hidden=64, heads=4, kv_heads=2)
    models.perturb(model)
    flat = tmp_path / "flat.onnx"
    torch.onnx.export(model, args, str(flat), kwargs=kwargs, dynamo=True, external_data=False)
    owner = _linear_owners(onnx.load(str(flat)))
    quantizer = MatMulNBitsQuantizer(onnx.load(str(flat)), block_size=32, is_symmetric=True)
    quantizer.process()
    source = tmp_path / "q4.onnx"
    quantizer.model.save_model_to_file(str(source))

    rules = (ROOT / "rules" / "llama.rules").read_text()
    result = _outline(source, rules, tmp_path / "out.onnx")
    assert result.tree.graph.structure == "metadata"
    check_onnx(tmp_path / "out.onnx")
    _assert_same_in_onnxruntime(source, tmp_path / "out.onnx")
    tree = result.tree
    placed = {}
    for node in tree.graph.nodes:
        if node.target == "com.microsoft::MatMulNBits":
            group = tree.records[int(tree.group_of[node.index])]
            placed[node.name] = group.call.key if group.call is not None else None
    assert len(placed) == len(owner) == 14
    for name, key in placed.items():  # the quantizer names it after the MatMul it replaced
        assert key == owner[name.removesuffix("_Q4")].rsplit(".", 1)[0], name
    out = ir.load(tmp_path / "out.onnx")
    assert not [n for n in out.graph if n.op_type == "MatMulNBits"]
    assert {f.name for f in out.functions.values() if any(n.op_type == "MatMulNBits" for n in f)
            } == {"LlamaAttention", "LlamaMLP"}
    assert Counter(n.op_type for n in out.graph)["LlamaDecoderLayer"] == 2
    assert len([f for f in out.functions.values() if f.name == "LlamaAttention"]) == 1


def test_quantized_weights_stay_in_their_linear(tmp_path):
    """onnxruntime's static QDQ quantizer puts each Linear's weight behind a
    ``DequantizeLinear`` without metadata, at the top of the graph: grouped by ``Linear``
    (class), the weight's node is in its own Linear's group (the call its ``Gemm`` is in), not
    in the Block above it nor in a call of its own; the three Linears share one function."""
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from tools import models

    model, args, _ = models.chain()  # Blocks of one Linear each: blocks.N -> blocks.N.lin
    flat, source = tmp_path / "flat.onnx", tmp_path / "qdq.onnx"
    torch.onnx.export(model, args, str(flat), dynamo=True, external_data=False)
    calibration = iter([{"x": np.random.default_rng(n).standard_normal((2, 4), np.float32)}
                        for n in range(4)])
    reader = type("Reader", (), {"get_next": lambda self: next(calibration, None)})()
    quantize_static(str(flat), str(source), reader, quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt8, op_types_to_quantize=["Gemm"])

    result = _outline(source, "group class *Linear\n", tmp_path / "out.onnx")
    tree = result.tree
    group_of = {node.name: tree.records[int(tree.group_of[node.index])]
                for node in tree.graph.nodes}
    for n in range(3):
        linear = group_of[f"node_linear_{n}" if n else "node_linear"]
        assert linear.call is not None and linear.call.path == f"blocks.{n}.lin"
        weight = group_of[f"blocks.{n}.lin.weight_DequantizeLinear"]
        assert weight is linear, (n, weight.call)
    check_onnx(tmp_path / "out.onnx")
    _assert_same_in_onnxruntime(source, tmp_path / "out.onnx")
    out = ir.load(tmp_path / "out.onnx")
    calls = _layer_calls(out)
    # one function: the int32 quantized biases are weights (inputs), not constants of a body
    assert [call.op_type for call in calls] == ["Linear"] * 3
    for n, call in enumerate(calls):  # the weight, an initializer, passed to its Linear
        assert f"blocks.{n}.lin.weight_quantized" in [v.name for v in call.inputs if v]
        body = out.functions[call.op_identifier()]
        assert Counter(node.op_type for node in body)["DequantizeLinear"] == 2  # weight, bias


def _linear_owners(proto: onnx.ModelProto) -> dict[str, str]:
    """The MatMul nodes of Linear modules -> the Linear's path (from torch.onnx's metadata,
    before the quantizer drops it)."""
    out = {}
    for node in proto.graph.node:
        scopes = {p.key: p.value for p in node.metadata_props}.get(
            "pkg.torch.onnx.name_scopes", "")
        if node.op_type == "MatMul" and "proj" in scopes:
            out[node.name] = ast.literal_eval(scopes)[-2]
    return out


def test_scopes_from_node_names():
    """Each producer's naming conventions: numbered ops, a ModuleList index in one step, an
    unnamed node read by its output's name, constant folders and top-level constants without
    a scope, names that are no scope (a tool's node), the top level."""
    import onnx.helper as oh

    from rewrite.frontends.onnx.graph import from_onnx_model

    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    nodes = [
        oh.make_node("Neg", ["x"], ["a"], name="/enc/layer.0/attn/q/MatMul_1"),
        oh.make_node("Neg", ["a"], ["/enc/layer.1/attn/Neg_output_0"]),  # unnamed
        oh.make_node("Neg", ["/enc/layer.1/attn/Neg_output_0"], ["b"],
                     name="/model/layers.1/mlp/down/MatMul/output_0"),
        oh.make_node("Constant", [], ["k"], name="/model/constant_nodes/INT64/1",
                     value=oh.make_tensor("k", onnx.TensorProto.FLOAT, [2], [1, 2])),
        oh.make_node("Constant", [], ["k2"], name="/Constant_3",
                     value=oh.make_tensor("k2", onnx.TensorProto.FLOAT, [2], [1, 2])),
        oh.make_node("Add", ["b", "k"], ["c"], name="SkipLayerNorm_AddBias_0"),
        oh.make_node("Add", ["c", "k2"], ["y"], name="/Add_2"),
    ]
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    model = ir.from_proto(oh.make_model(oh.make_graph(nodes, "g", [x], [y])))
    graph = from_onnx_model(model)
    assert graph.structure == "node names"
    stacks = {n.name or n.source.outputs[0].name: n.stack for n in graph.nodes if n.op == "onnx"}
    paths = {name: None if stack is None else [c.path for c in stack]
             for name, stack in stacks.items()}
    assert paths == {
        "/enc/layer.0/attn/q/MatMul_1": ["enc", "enc.layer.0", "enc.layer.0.attn",
                                         "enc.layer.0.attn.q"],
        "/enc/layer.1/attn/Neg_output_0": ["enc", "enc.layer.1", "enc.layer.1.attn"],
        "/model/layers.1/mlp/down/MatMul/output_0": [
            "model", "model.layers.1", "model.layers.1.mlp", "model.layers.1.mlp.down",
            "model.layers.1.mlp.down.MatMul"],
        "/model/constant_nodes/INT64/1": None, "/Constant_3": None,
        "SkipLayerNorm_AddBias_0": None, "/Add_2": [],
    }
    assert {c.cls for c in graph.calls} == {""}
    assert [c.class_name for c in graph.calls[:2]] == ["enc", "layer"]
