"""``--precision int4`` from a half-precision checkpoint without a float32 copy, and the check
before publishing: the written model against eager run on the same int4 weights dequantized,
float32's tolerance, so that a wrong layout or a weight wired to the wrong call fails it
(mutants below), the error against eager float32 reported."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.backends.onnx import _blockwise, quantize
from rewrite.errors import VerificationError
from rewrite.exporting.int4 import float32_shell
from tests import checkpoints
from tests.test_precision import _eager, _feeds, _in_int4, _linears

HALF = [("llama", torch.bfloat16), pytest.param("gpt2", torch.bfloat16, marks=pytest.mark.slow),
        pytest.param("phi3", torch.float16, marks=pytest.mark.slow)]
"""Llama; GPT-2: Conv1D weights and a tied head; Phi-3: fused projections, fp16."""


@pytest.mark.parametrize("family, dtype", HALF)
def test_half_checkpoint_to_int4_equals_eager_on_the_same_weights(family, dtype, tmp_path,
                                                                   run_cli):
    folder = checkpoints.write(family, tmp_path / "ckpt", dtype=dtype)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    r = run_cli("export", folder, "-o", out, "--cache", "kv", "--precision", "int4")
    assert r.code == 0, r
    assert "on the same int4 weights dequantized" in r.err, r.err
    assert "and one decode step, from one eager call" in r.err  # one dequantizing pass
    assert "int4 against eager float32 (prefill): max |difference|" in r.err
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    packed = [t for t in onnx.load(str(out), load_external_data=False).graph.initializer
              if t.data_type == onnx.TensorProto.INT4]
    assert _in_int4(t.name for t in packed) == _linears(folder)
    plain = ort.SessionOptions()  # unfused: the file's DequantizeLinear, then MatMul
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(out), plain, providers=["CPUExecutionProvider"])
    ids = np.array([[3, 14, 15, 9, 26, 5, 35, 8]], np.int64)
    logits = session.run(["logits"], _feeds(session, ids))[0]
    fake = _eager(folder, ids, fake_quant=True)  # the checkpoint's values, in float32
    assert np.abs(logits - fake).max() <= 1e-4 * max(1.0, np.abs(fake).max())
    assert np.abs(logits - _eager(folder, ids, fake_quant=False)).max() > 1e-3


def test_the_shell_keeps_the_linear_and_embedding_weights_as_built(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sources = float32_shell(model)
    held = {f"{n}.weight" for n, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    assert set(sources) == held
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        if name in sources:  # a placeholder: its value is the source's, as built
            assert sources[name].dtype == torch.bfloat16
            assert torch.equal(sources[name], before[name])
            assert torch.count_nonzero(p) <= 1
        else:
            assert torch.equal(p, before[name].float()), name


def _export_fails(tmp_path, **kwargs) -> VerificationError:
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    with pytest.raises(VerificationError) as failed:
        rewrite.export(folder, output=out, cache="kv", precision="int4", **kwargs)
    assert list(out.parent.iterdir()) == []
    return failed.value


@pytest.mark.slow
def test_a_weight_wired_to_another_call_fails_the_check(tmp_path, monkeypatch):
    original = quantize._Initializers.of
    first: dict = {}

    def layer_0_everywhere(self, value, layout):  # the mutant: every call, layer 0's weights
        return first.setdefault((tuple(value.shape), layout), original(self, value, layout))

    monkeypatch.setattr(quantize._Initializers, "of", layer_0_everywhere)
    assert "differs by up to" in str(_export_fails(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("symmetric", [True, False])
def test_a_wrong_layout_fails_the_check(tmp_path, monkeypatch, symmetric):
    original = _blockwise._packed

    def transposed(rows, pairs, like):  # the mutant: square weights written [N, K]
        if rows is not None and rows.shape[0] == rows.shape[1]:  # o_proj (not packed)
            rows = rows.T.contiguous()
            pairs = _blockwise._row_pairs(rows)
        return original(rows, pairs, like)

    monkeypatch.setattr(_blockwise, "_packed", transposed)
    assert "differs by up to" in str(_export_fails(tmp_path, symmetric=symmetric))


def _by_rows_everywhere(monkeypatch) -> list:
    """Every plain linear layer of the check computes by blocks of rows (as a head over a
    vocabulary does): 6 rows at a time, so that the last block is partial; the calls."""
    from rewrite.exporting import int4

    calls: list = []
    original = int4._linear_by_rows

    def counted(module, weight, buffers, x):
        calls.append(module)
        return original(module, weight, buffers, x)

    monkeypatch.setattr(int4, "BY_ROWS_ABOVE", 0)
    monkeypatch.setattr(int4, "ROWS_AT_ONCE", 6 * 64)
    monkeypatch.setattr(int4, "_linear_by_rows", counted)
    return calls


def test_a_weight_made_by_rows_gives_the_same_check(tmp_path, monkeypatch):
    calls = _by_rows_everywhere(monkeypatch)
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, cache="kv", precision="int4")
    shapes = {tuple(m.weight.shape) for m in calls}
    assert len({id(m) for m in calls}) >= 2 and len(shapes) >= 2, shapes  # a head, layers
    plain = ort.SessionOptions()  # the file's DequantizeLinear, then MatMul
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(out), plain, providers=["CPUExecutionProvider"])
    ids = np.array([[3, 14, 15, 9, 26, 5, 35, 8]], np.int64)
    logits = session.run(["logits"], _feeds(session, ids))[0]
    fake = _eager(folder, ids, fake_quant=True)
    assert np.abs(logits - fake).max() <= 1e-4 * max(1.0, np.abs(fake).max())


def test_a_wrong_block_of_rows_fails_the_check(tmp_path, monkeypatch):
    from rewrite.exporting import int4

    _by_rows_everywhere(monkeypatch)
    original = int4._kept_rows

    def shifted(kept, key, block, start, stop, out):  # the mutant: rows 2 further on
        if stop + 2 <= kept.weight(key, "NK", block).shape[0]:
            start, stop = start + 2, stop + 2
        return original(kept, key, block, start, stop, out)

    monkeypatch.setattr(int4, "_kept_rows", shifted)
    assert "differs by up to" in str(_export_fails(tmp_path))


def test_packed_projections_are_dequantized_part_by_part(tmp_path, monkeypatch):
    """q / k / v and gate / up, each written as one packed weight, are dequantized in the
    check part by part into each projection's buffer (the part's rows of the packed weight
    kept), not made whole and sliced; a mutant reading each part 2 rows further on fails
    the check."""
    from rewrite.exporting import int4

    original = int4._kept_rows
    parts: list = []

    def counted(kept, key, block, start, stop, out):
        parts.append((key, start, stop))
        return original(kept, key, block, start, stop, out)

    monkeypatch.setattr(int4, "_kept_rows", counted)
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, cache="kv", precision="int4")
    later = {key.split(":")[0].rsplit(".", 1)[0] for key, start, _ in parts if start > 0}
    assert any("self_attn" in name for name in later) and any("mlp" in name for name in later)

    def shifted(kept, key, block, start, stop, out):  # the mutant: rows 2 further on
        if start > 0 and stop + 2 <= kept.weight(key, "NK", block).shape[0]:
            start, stop = start + 2, stop + 2
        return original(kept, key, block, start, stop, out)

    monkeypatch.setattr(int4, "_kept_rows", shifted)
    assert "differs by up to" in str(_export_fails(tmp_path / "mutant"))


def test_a_tied_head_made_by_rows_passes_the_check(tmp_path, monkeypatch):
    """``--target onnxruntime``'s tied head (``MatMulNBits`` on the embedding's table, kept by
    rows) made a block of rows at a time: the export's own check, at float32's tolerance
    against eager on the same weights, passes."""
    calls = _by_rows_everywhere(monkeypatch)
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16,
                               tie_word_embeddings=True)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, cache="kv", precision="int4", target="onnxruntime")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert any(m.weight.shape[0] == vocab for m in calls)  # the head, by rows
    graph = onnx.load(str(out), load_external_data=False).graph
    assert [n.op_type for n in graph.node].count("MatMulNBits") == 1
