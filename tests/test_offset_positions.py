"""RoBERTa's family numbers its tokens from ``padding_idx + 1``: ``rewrite export`` writes a
graph that takes the documented ``position_ids`` (0, 1, ..., as onnxruntime-genai feeds them)
and adds the offset itself, so the written model gives the model's own logits (its forward
with no positions given). Tiny random RoBERTa and XLM-RoBERTa decoders (``is_decoder``)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.exporting.checkpoint.cache import position_offset
from tests import checkpoints

PROMPT, DECODE_STEPS, BATCH = 5, 3, 3
LAYER_CLASSES = {"roberta": "RobertaLayer", "xlm-roberta": "XLMRobertaLayer"}


@pytest.fixture(scope="module", params=["roberta", pytest.param("xlm-roberta",
                                                                marks=pytest.mark.slow)])
def exported(request, tmp_path_factory):
    """(family, checkpoint folder, ONNX path, onnx_ir model), exported once per family."""
    root = tmp_path_factory.mktemp(request.param)
    folder = checkpoints.write(request.param, root / "checkpoint")
    out = root / "out" / "model.onnx"
    out.parent.mkdir()
    return request.param, folder, out, rewrite.export(folder, output=out)


def _eager(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def _run(session, ids, total, past) -> dict:
    """One step of the ONNX model fed the documented inputs: positions from 0."""
    length = ids.shape[1]
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((ids.shape[0], total), np.int64),
             "position_ids": np.tile(np.arange(total - length, total), (ids.shape[0], 1)),
             **past}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def test_prefill_and_decode_equal_the_models_own_call(exported):
    family, folder, out, model = exported
    onnx.checker.check_model(str(out), full_check=True)
    eager = _eager(folder)
    assert position_offset(eager) == eager.config.pad_token_id + 1 == 2
    from transformers import DynamicCache

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = torch.randint(2, eager.config.vocab_size, (BATCH, PROMPT),
                        generator=torch.Generator().manual_seed(1))
    past = {i.name: np.zeros([BATCH if d == "batch_size" else 0 if isinstance(d, str) else d
                              for d in i.shape], np.float32)
            for i in session.get_inputs() if i.name.startswith("past_key_values.")}
    cache, total, errors = DynamicCache(config=eager.config), PROMPT, []
    for _ in range(1 + DECODE_STEPS):
        with torch.no_grad():  # the model's own call: no positions given
            reference = eager(input_ids=ids, attention_mask=torch.ones(BATCH, total,
                                                                       dtype=torch.long),
                              cache=cache, use_cache=True).logits
        outputs = _run(session, ids, total, past)
        errors.append(float(np.abs(outputs["logits"] - reference.numpy()).max()))
        past = {k.replace("present.", "past_key_values."): v for k, v in outputs.items()
                if k.startswith("present.")}
        ids, total = reference[:, -1:].argmax(-1), total + 1
    assert max(errors) <= 1e-4, errors
    # and fed without the offset the eager model differs: the test can tell
    with torch.no_grad():
        unshifted = eager(input_ids=ids, position_ids=torch.zeros_like(ids)).logits
        shifted = eager(input_ids=ids, position_ids=torch.full_like(ids, 2)).logits
    assert float((unshifted - shifted).abs().max()) > 1e-3
    layers = [f for f in model.functions.values() if f.name == LAYER_CLASSES[family]]
    assert len(layers) == 1  # one function serves both decoder layers


def test_a_left_padded_prompt_equals_eager_on_its_tokens(exported):
    """Pads hold the padding index, as a tokenizer writes them; positions from the mask, as
    onnxruntime-genai feeds them: every real token's logits are the model's own."""
    family, folder, out, _ = exported
    eager = _eager(folder)
    pad = eager.config.pad_token_id
    ids = torch.randint(2, eager.config.vocab_size, (2, PROMPT),
                        generator=torch.Generator().manual_seed(2))
    ids[0, :2] = pad
    mask = (ids != pad).long()
    with torch.no_grad():
        reference = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits.numpy()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    past = {i.name: np.zeros((2, i.shape[1], 0, i.shape[3]), np.float32)
            for i in session.get_inputs() if i.name.startswith("past_key_values.")}
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
             "position_ids": (mask.cumsum(-1) - 1).clamp(min=0).numpy(), **past}
    logits = session.run(["logits"], feeds)[0]
    real = mask.numpy().astype(bool)
    assert float(np.abs(logits - reference)[real].max()) <= 1e-4


def test_genai_context_leaves_out_the_offset(exported):
    """The position table has ``max_position_embeddings`` rows, the first two never a
    token's: onnxruntime-genai is told the context the tokens can fill."""
    _, folder, out, _ = exported
    config = json.loads((out.parent / "genai_config.json").read_text())
    eager = _eager(folder)
    context = eager.config.max_position_embeddings - position_offset(eager)
    assert config["model"]["context_length"] == config["search"]["max_length"] == context


@pytest.mark.slow
def test_the_fixed_cache_adds_the_offset_too(tmp_path):
    """``--cache static``: the slots are the positions from 0, the model is given them from
    ``padding_idx + 1``; the export's own check (prefill and a decode step against the
    model's own call) passes, so the file is written."""
    folder = checkpoints.write("roberta", tmp_path / "checkpoint")
    out = tmp_path / "static.onnx"
    rewrite.export(folder, output=out, cache="static", context=16)
    onnx.checker.check_model(str(out), full_check=True)
