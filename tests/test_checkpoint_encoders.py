"""``rewrite export DIR`` of an encoder (BERT) and of encoder-decoders (BART, T5), prefill
only: small random checkpoints in, ONNX out, equal to eager PyTorch in onnxruntime at a batch
and sequence lengths other than the export's example; one function per layer class where the
layers are alike; the dimension names; ``--cache kv`` refused for them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.errors import InputError
from tests import checkpoints

transformers = pytest.importorskip("transformers")

BATCH, TOKENS, DECODER_TOKENS = 3, 7, 4


@pytest.fixture(scope="module", params=[
    family if family == "bert" else pytest.param(family, marks=pytest.mark.slow)
    for family in checkpoints.ENCODERS])  # the encoder-decoders (BART, T5): make test-all
def exported(request, tmp_path_factory):
    """(family, folder, ONNX path) of one family's checkpoint, exported once."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = checkpoints.write(family, root / "checkpoint")
    out = root / "model.onnx"
    rewrite.export(folder, output=out)
    return family, folder, out


def _inputs(names: list[str]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    mask[0, :2] = 0  # a left-padded row
    found = {"input_ids": torch.randint(0, 96, (BATCH, TOKENS), generator=generator),
             "attention_mask": mask,
             "token_type_ids": torch.randint(0, 2, (BATCH, TOKENS), generator=generator),
             "decoder_input_ids": torch.randint(0, 96, (BATCH, DECODER_TOKENS),
                                                generator=generator)}
    return {name: found[name] for name in names}


def test_equal_to_eager_in_onnxruntime(exported):
    family, folder, out = exported
    onnx.checker.check_model(str(out), full_check=True)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    inputs = _inputs([i.name for i in session.get_inputs()])
    model_class = getattr(transformers, checkpoints.ENCODERS[family][2])
    eager = model_class.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        want = eager(**inputs, return_dict=True)
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    names = [o.name for o in session.get_outputs()]
    assert names[0] == "logits"
    for name, value in zip(names, got):
        np.testing.assert_allclose(value, want[name].numpy(), atol=1e-4, rtol=1e-4,
                                   err_msg=name)


LAYERS = {"bert": ["BertLayer"], "bart": ["BartEncoderLayer", "BartDecoderLayer"]}
"""The layer classes whose layers are alike (T5's first block of each stack computes the
position bias the others take: two functions per stack, rightly)."""


@pytest.mark.parametrize("exported", ["bert", pytest.param("bart", marks=pytest.mark.slow)],
                         indirect=True)
def test_one_function_per_layer_class(exported):
    family, _, out = exported
    model = onnx.load(str(out), load_external_data=False)
    calls = {}
    for function in model.functions:
        for node in function.node:
            calls.setdefault(node.op_type, []).append(node)
    for node in model.graph.node:
        calls.setdefault(node.op_type, []).append(node)
    for layer in LAYERS[family]:
        assert [f.name for f in model.functions].count(layer) == 1, layer
        assert len(calls[layer]) == checkpoints.LAYERS, layer


def test_dimensions_are_named(exported):
    family, _, out = exported
    model = onnx.load(str(out), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    tokens = "sequence_length" if family == "bert" else "encoder_sequence_length"
    assert dims["input_ids"] == dims["attention_mask"] == ["batch_size", tokens]
    if family != "bert":
        assert dims["decoder_input_ids"] == ["batch_size", "decoder_sequence_length"]
        assert dims["logits"][:2] == ["batch_size", "decoder_sequence_length"]


def test_a_kv_cache_is_refused_for_them_by_the_library(tmp_path):
    folder = checkpoints.write("bert", tmp_path / "checkpoint")
    with pytest.raises(InputError, match="not a causal language model: --cache kv needs one"):
        rewrite.export(folder, output=tmp_path / "model.onnx", cache="kv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_the_command_takes_an_encoder_without_flags_and_refuses_kv(tmp_path, run_cli):
    folder = checkpoints.write("bert", tmp_path / "checkpoint")
    r = run_cli("export", folder, "-o", tmp_path / "model.onnx")
    assert r.code == 0, r
    onnx.checker.check_model(str(tmp_path / "model.onnx"), full_check=True)
    r = run_cli("export", folder, "-o", tmp_path / "kv.onnx", "--cache", "kv")
    assert r.code == 2 and "--cache kv needs one (use --cache none)" in r.err, r
    assert not (tmp_path / "kv.onnx").exists()
