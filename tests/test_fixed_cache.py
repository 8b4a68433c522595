"""``rewrite export --cache static --context C``: a fixed-size KV cache written in place at
``position_ids`` (issue 41). A prompt longer than one chunk is fed in chunks into the fixed
buffer, then decode steps, in onnxruntime, and equals the eager model (1e-4), for a batch of
one row and a batch with a left-padded row; ``--static`` leaves no symbolic dimension."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from tests import checkpoints
from tests.test_checkpoint_export import Recorder

CONTEXT, CHUNK, PROMPT, DECODE = 24, 4, 10, 8
LAYERS = {"llama": "LlamaDecoderLayer", "qwen3": "Qwen3DecoderLayer",
          "phi3": "Phi3DecoderLayer", "gemma2": "Gemma2DecoderLayer",
          "qwen2_moe": "Qwen2MoeDecoderLayer"}


FAMILIES = [family if family == "llama" else pytest.param(family, marks=pytest.mark.slow)
            for family in LAYERS]
"""Llama in make test; the other families (sliding windows, MoE...) in make test-all."""


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = checkpoints.write(family, root / "checkpoint")
    out = root / "model.onnx"
    progress = Recorder()
    rewrite.export(folder, output=out, cache="static", context=CONTEXT, progress=progress)
    return family, folder, out, progress


def test_each_layer_kind_is_traced_once(exported):
    """The program of one traced layer per kind, extended to every layer, is what is written:
    its in-place cache writes made functional without binding the recorded layers to one
    layer's weights (the MoE's fell back to tracing every layer)."""
    family, _, _, progress = exported
    assert "traces every layer" not in progress.text, progress.text
    kinds = 2 if family == "gemma2" else 1  # sliding-window and global layers
    assert f"{kinds} of {checkpoints.LAYERS} layers traced ({LAYERS[family]}" in progress.text
    assert "recorded as calls of their traces" in progress.text


def _eager(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def _run(session, layout, ids: np.ndarray, pads: list[int]) -> np.ndarray:
    """The prompt in chunks of CHUNK, then DECODE greedy steps; the logits of every real
    token, row by row (row b's first ``pads[b]`` tokens are padding, position -1)."""
    batch = ids.shape[0]
    past = {}
    for n, layer in enumerate(layout):
        key, value = layer.empty(batch, CONTEXT)
        past[f"past_key_values.{n}.key"], past[f"past_key_values.{n}.value"] = \
            key.numpy(), value.numpy()
    pads_ = np.array(pads)[:, None]
    logits, done = [], 0
    tokens = ids
    while done < PROMPT + DECODE:
        if done < PROMPT:
            chunk = tokens[:, done:min(done + CHUNK, PROMPT)]
        else:
            chunk = logits[-1][:, -1:].argmax(-1)
        width = chunk.shape[1]
        columns = np.arange(done, done + width)[None]
        positions = np.where(columns < pads_, -1, columns - pads_)
        filled = done + width - pads_  # real tokens of each row so far
        mask = (np.arange(CONTEXT)[None] < filled).astype(np.int64)
        outputs = session.run(None, {"input_ids": chunk.astype(np.int64),
                                     "attention_mask": mask, "position_ids": positions,
                                     **past})
        names = [o.name for o in session.get_outputs()]
        result = dict(zip(names, outputs))
        logits.append(result["logits"])
        past = {k.replace("present", "past_key_values"): v for k, v in result.items()
                if k.startswith("present.")}
        done += width
    return np.concatenate(logits, axis=1)


@pytest.mark.parametrize("pads", [[0], [0, 3]], ids=["one row", "left-padded row"])
def test_chunked_prefill_and_decode_equal_eager(exported, pads):
    from rewrite.exporting.checkpoint.cache import cache_layout

    family, folder, out, _ = exported
    eager = _eager(folder)
    layout = cache_layout(eager)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, eager.config.vocab_size, (len(pads), PROMPT), generator=generator)
    got = _run(session, layout, ids.numpy(), pads)
    for row, pad in enumerate(pads):
        real = ids[row:row + 1, pad:]
        generated = got[row, PROMPT - 1:-1].argmax(-1)  # the greedy tokens fed back
        sequence = torch.cat([real, torch.from_numpy(generated)[None]], 1)
        with torch.no_grad():
            want = eager(input_ids=sequence).logits[0].numpy()
        np.testing.assert_allclose(got[row, pad:], want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module", params=FAMILIES)
def static_exported(request, tmp_path_factory):
    """Every shape fixed (batch 1, chunks of CHUNK tokens)."""
    family = request.param
    root = tmp_path_factory.mktemp(f"{family}-static")
    folder = checkpoints.write(family, root / "checkpoint")
    out = root / "model.onnx"
    rewrite.export(folder, output=out, cache="static", context=CONTEXT,
                   static={"batch": 1, "seq": CHUNK})
    return family, folder, out


def test_one_function_per_layer_class_taking_and_returning_its_buffers(static_exported):
    family, _, out = static_exported
    model = onnx.load(str(out), load_external_data=False)
    layers = [n for n in model.graph.node if n.op_type == LAYERS[family]]
    assert len(layers) == checkpoints.LAYERS
    assert len({(n.domain, n.op_type) for n in layers}) == 1
    assert sum(f.name == LAYERS[family] for f in model.functions) == 1
    for n, node in enumerate(layers):
        assert f"past_key_values.{n}.key" in node.input
        assert f"present.{n}.key" in node.output and f"present.{n}.value" in node.output
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    assert dims["attention_mask"] == [1, CONTEXT]
    assert dims["past_key_values.0.key"][2] == CONTEXT == dims["present.0.key"][2]
    ops = {n.op_type for f in model.functions for n in f.node}
    assert "ScatterElements" in ops and "Concat" not in {
        n.op_type for f in model.functions if f.name == LAYERS[family] for n in f.node}


def test_dynamic_batch_and_chunk_keep_one_function_per_layer_class(exported):
    """With batch and chunk dynamic too (the MoE's sizes of its tokens, computed once by the
    program and first read in its first layer, are read by every layer alike)."""
    family, _, out, _ = exported
    model = onnx.load(str(out), load_external_data=False)
    kinds = {n.op_type for n in model.graph.node if n.op_type.startswith(LAYERS[family])}
    assert len(kinds) == 1, kinds


def test_static_shapes_leave_no_symbolic_dimension(static_exported):
    _, _, out = static_exported
    onnx.checker.check_model(str(out), full_check=True)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(out)), data_prop=True)
    symbolic = [(v.name, [d.dim_param for d in v.type.tensor_type.shape.dim])
                for v in [*inferred.graph.input, *inferred.graph.output,
                          *inferred.graph.value_info]
                if any(d.dim_param or not d.HasField("dim_value")
                       for d in v.type.tensor_type.shape.dim)]
    assert not symbolic, symbolic[:5]


@pytest.mark.parametrize("options, message", [
    ({"cache": "static"}, "--cache static needs --context C"),
    ({"cache": "kv", "context": 8}, "--context sets the length of a fixed cache"),
    ({"cache": "kv", "static": {"batch": 1}}, "--static fixes every shape"),
    ({"cache": "static", "context": 3, "static": {"seq": 4}},
     "the chunk (4 tokens) is longer than the context (3)"),
])
def test_bad_fixed_cache_options_write_nothing(options, message, tmp_path):
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    with pytest.raises(rewrite.InputError, match=message.replace("(", r"\(").replace(
            ")", r"\)")):
        rewrite.export(folder, output=out, **options)
    assert not list(out.parent.iterdir())


def test_check_static_passes_the_static_models(static_exported, run_cli):
    """``rewrite check-static``: nothing to report in a --static dense model; the MoE's
    expert routing is data-dependent whatever the shapes (reported, with its function)."""
    family, _, out = static_exported
    r = run_cli("check-static", out)
    if family == "qwen2_moe":
        assert r.code == 1 and "Qwen2MoeExperts" in r.out, r.out
    else:
        assert r.code == 0, r.out
        assert "nothing a static compiler rejects" in r.err + r.out


def test_check_static_names_what_stops_a_dynamic_model(exported, run_cli):
    _, _, out, _ = exported
    r = run_cli("check-static", out)
    assert r.code == 1
    assert "function pkg.transformers::" in r.out
    assert "is not a number" in r.out  # batch_size, sequence_length


def test_check_static_refuses_what_is_not_onnx(tmp_path, run_cli):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    r = run_cli("check-static", bad)
    assert r.code == 2 and "not a readable ONNX model" in r.err
