"""``--precision int4`` writes a tied embedding's table in 4 bits (an untied one stays
float, as onnxruntime-genai's builder keeps it): tied and untied Llama, the table by rows
(uint8, two values to a byte: ONNX's ``Gather`` takes no 4-bit type) with its scales, the
rows gathered then dequantized with standard ops; a tied head's own int4 copy holds the
same numbers, or, ``--target onnxruntime``, the head reads the table itself
(``com.microsoft.MatMulNBits``: one table); onnxruntime and onnxruntime-genai compute what
the export's check computes in eager, within a stated error of float32."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.backends.onnx import _blockwise
from rewrite.errors import VerificationError
from rewrite.exporting.verify import open_session
from tests import checkpoints
from tests.test_genai_folder import NEW_TOKENS, PROMPT, og_greedy, write_tokenizer
from tests.test_precision import ERROR, FUSED, MEAN_ERROR, _eager, _feeds

IDS = np.array([[3, 14, 15, 9, 26, 5, 35, 8, 95, 0]], np.int64)


@pytest.fixture(scope="module", params=["tied", pytest.param("untied", marks=pytest.mark.slow),
                                        pytest.param("tied-onnxruntime", marks=pytest.mark.slow)])
def exported(request, tmp_path_factory):
    """(tied, target, checkpoint folder, output) of a bf16 Llama exported in int4."""
    tied, target = request.param.startswith("tied"), request.param.partition("-")[2]
    root = tmp_path_factory.mktemp(request.param)
    folder = checkpoints.write("llama", root / "ckpt", dtype=torch.bfloat16,
                               tie_word_embeddings=tied)
    write_tokenizer(folder, 96)
    (root / "out").mkdir()
    out = root / "out" / "model.onnx"
    rewrite.export(folder, output=out, cache="kv", precision="int4", target=target or None)
    return tied, target, folder, out


def _initializers(out) -> dict[str, np.ndarray]:
    model = onnx.load(str(out))
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def test_the_table_is_written_in_four_bits(exported):
    tied, target, folder, out = exported
    model = onnx.load(str(out), load_external_data=False)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    types = {t.name: (t.data_type, tuple(t.dims)) for t in model.graph.initializer}
    if not tied:  # the builder's choice: the table float, only the head in 4 bits
        assert types["model.embed_tokens.weight"] == (onnx.TensorProto.FLOAT, (96, 32))
        assert not [name for name in types if "_rows" in name]
        assert types["lm_head.weight_Q4G32"] == (onnx.TensorProto.INT4, (32, 96))
        return
    table = "lm_head.weight"
    assert types[f"{table}_rows_Q4G32"] == (onnx.TensorProto.UINT8, (96, 1, 16))
    assert types[f"{table}_rows_scale"] == (onnx.TensorProto.FLOAT, (96, 1))
    floats = [name for name, (kind, dims) in types.items()
              if kind == onnx.TensorProto.FLOAT and 96 in dims and 32 in dims]
    assert floats == []  # no float copy of the table, tied or not
    local = {f.domain for f in model.functions}  # the model's own functions
    nodes = [n for f in model.functions for n in f.node] + list(model.graph.node)
    users = [n for n in model.graph.node if f"{table}_rows_Q4G32" in n.input]
    if target:  # one table, read by the embedding's call and by the head's MatMulNBits
        assert "lm_head.weight_Q4G32" not in types
        assert len(users) == 2 and "MatMulNBits" in [n.op_type for n in users]
        head = next(n for n in users if n.op_type == "MatMulNBits")
        levels = [a.i for a in head.attribute if a.name == "accuracy_level"]
        assert levels == [4]  # int8 activations, as the builder's head
        assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == [
            "MatMulNBits"]  # in the bodies: tests/test_onnxruntime_target.py
    else:
        assert types["lm_head.weight_Q4G32"] == (onnx.TensorProto.INT4, (32, 96))
        assert {n.domain for n in nodes} - local <= {""}  # standard ops
        assert len(users) == 1


@pytest.mark.parametrize("exported", ["tied"], indirect=True)  # the head a copy of its own
def test_a_tied_head_holds_the_same_numbers(exported):
    tied, target, folder, out = exported
    values = _initializers(out)
    codes = values["lm_head.weight_rows_Q4G32"]
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(96, 32).astype(np.float32)
    rows = (nibbles - 8) * np.repeat(values["lm_head.weight_rows_scale"], 32, axis=1)
    head = _blockwise.dequantize(values["lm_head.weight_Q4G32"].astype(np.int8),
                                 values["lm_head.weight_scale"], None, 32)
    np.testing.assert_array_equal(rows, head.T)


def test_onnxruntime_computes_the_checks_reference(exported):
    tied, target, folder, out = exported
    plain = ort.SessionOptions()  # unfused: the file's ops as written
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ort.InferenceSession(str(out), plain, providers=["CPUExecutionProvider"])
    fake = _eager(folder, IDS, fake_quant=True)  # every table and linear weight quantized
    as_written = unfused.run(["logits"], _feeds(unfused, IDS))[0]
    # the check's session: every MatMulNBits in float32 (the file's head asks for int8
    # activations, as the builder's): the quantized model's numbers to float32's rounding
    checked = open_session(out, int4=True, nbits=bool(target))
    np.testing.assert_allclose(checked.run(["logits"], _feeds(checked, IDS))[0], fake,
                               atol=1e-5, rtol=0)
    if target:
        assert np.abs(as_written - fake).max() <= FUSED * np.abs(fake).max()
    else:
        np.testing.assert_allclose(as_written, fake, atol=1e-5, rtol=0)
    fused = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = fused.run(["logits"], _feeds(fused, IDS))[0]
    assert np.abs(logits - fake).max() <= FUSED * np.abs(fake).max()
    eager = _eager(folder, IDS, fake_quant=False)
    difference = np.abs(logits - eager)
    assert difference.max() <= ERROR * np.abs(eager).max()
    assert difference.mean() <= MEAN_ERROR * np.abs(eager).mean()


def test_onnxruntime_genai_generates(exported):
    tied, target, folder, out = exported
    tokens, logits = og_greedy(out.parent, PROMPT, NEW_TOKENS)
    assert len(tokens) == len(PROMPT) + NEW_TOKENS
    fake = _eager(folder, np.array([tokens[:-1]], np.int64), fake_quant=True)[0]
    for step, got in enumerate(logits):  # each step's logits: the quantized model's
        want = fake[len(PROMPT) - 1 + step]
        assert np.abs(got - want).max() <= FUSED * np.abs(want).max(), f"step {step}"


@pytest.mark.slow
@pytest.mark.parametrize("symmetric", [True, False])
def test_rows_written_wrong_fail_the_check(tmp_path, monkeypatch, symmetric):
    original = _blockwise._by_rows

    def swapped_nibbles(q, scale, zero_point, like):  # the mutant: pairs written reversed
        return original(q.view(q.shape[0], -1, 2).flip(-1).reshape(q.shape), scale,
                        zero_point, like)

    monkeypatch.setattr(_blockwise, "_by_rows", swapped_nibbles)
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16,
                               tie_word_embeddings=True)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "model.onnx"
    with pytest.raises(VerificationError, match="differs by up to"):
        rewrite.export(folder, output=out, cache="kv", precision="int4", symmetric=symmetric)
    assert list(out.parent.iterdir()) == []


@pytest.mark.slow
def test_a_row_length_not_a_multiple_of_the_block_stays_float(tmp_path):
    folder = checkpoints.write("llama", tmp_path / "ckpt")
    model = rewrite.export(folder, precision="int4", block_size=64)  # hidden 32
    tables = [v for v in model.graph.initializers.values()
              if v.name == "model.embed_tokens.weight"]
    assert [v.dtype for v in tables] == [ir.DataType.FLOAT]
    assert not [name for name in model.graph.initializers if "_rows" in name]


@pytest.mark.slow
@pytest.mark.parametrize("tied, symmetric", [(False, True), (True, False)])
def test_onnxruntime_target_shares_only_a_symmetric_tied_table(tied, symmetric, tmp_path):
    folder = checkpoints.write("llama", tmp_path / "ckpt", tie_word_embeddings=tied)
    model = rewrite.export(folder, precision="int4", symmetric=symmetric,
                           target="onnxruntime")
    ops = [n.op_type for n in model.graph]  # untied, or uint4 (MatMulNBits' zero points
    assert "MatMulNBits" not in ops            # are packed otherwise): the head's own copy
    assert ops.count("DequantizeLinear") == 1
    assert bool([n for n in model.graph.initializers if "_rows_" in n]) == tied
