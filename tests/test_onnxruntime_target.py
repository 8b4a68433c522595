"""``rewrite export --target onnxruntime`` writes onnxruntime's fused ops in the layer bodies.

Small random checkpoints (tests/checkpoints.py): the attention body holds one
``com.microsoft.GroupQueryAttention`` (its sequence lengths computed from the mask in the
body), the decoder layer's body one ``com.microsoft.SkipSimplifiedLayerNormalization`` (the
residual add and the RMSNorm after it), each once in the whole file (one function per layer
class, called by every layer); onnx's full check passes; prefill and 3 decode steps in
onnxruntime equal eager within 1e-4 (rows padded on the right only: the op's convention);
onnxruntime-genai generates transformers' greedy tokens from the folder; int4 stays within
the stated bounds of fp32. A sliding window keeps the standard ``Attention``; the default
target writes no ``com.microsoft`` op.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from tests import checkpoints
from tests.test_checkpoint_export import LAYER_CLASSES, Recorder, decode_and_compare
from tests.test_genai_folder import NEW_TOKENS, PROMPT, hf_greedy, og_greedy, write_tokenizer
from tests.test_precision import ERROR, FUSED, MEAN_ERROR, _eager, _feeds

MS = "com.microsoft"


def _export(tmp_path: Path, family: str = "llama", **options) -> tuple[Path, Path]:
    folder = checkpoints.write(family, tmp_path / "checkpoint", **options.pop("config", {}))
    write_tokenizer(folder, 96)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir(parents=True)
    rewrite.export(folder, output=out, progress=Recorder(), **options)
    return folder, out


def _bodies(out: Path) -> tuple[Counter, dict[str, Counter], Counter]:
    """Op types of the main graph, of each function body (``domain:op``), and how often each
    function is called, in the file as written (checked in full)."""
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    proto = onnx.load(str(out), load_external_data=False)
    bodies = {f.name: Counter(f"{n.domain}:{n.op_type}" for n in f.node)
              for f in proto.functions}
    calls = Counter(n.op_type for nodes in [proto.graph.node, *(f.node for f in
                                                               proto.functions)]
                    for n in nodes if n.op_type in bodies)
    return Counter(f"{n.domain}:{n.op_type}" for n in proto.graph.node), bodies, calls


def _once(bodies: dict[str, Counter], op: str) -> str:
    """The one body holding ``op``, holding it once."""
    holding = [name for name, ops in bodies.items() if ops[op]]
    assert len(holding) == 1 and bodies[holding[0]][op] == 1, bodies
    return holding[0]


@pytest.fixture(scope="module", params=[pytest.param("fp32", marks=pytest.mark.slow)])
def fp32(tmp_path_factory):  # an export and its check, ~10 s: the slow tier
    return _export(tmp_path_factory.mktemp("ort_fp32"), target="onnxruntime")


def test_each_fused_op_once_in_its_body_one_function_per_layer_class(fp32):
    folder, out = fp32
    main, bodies, calls = _bodies(out)
    attention = _once(bodies, f"{MS}:GroupQueryAttention")
    assert not bodies[attention][":Attention"] and not bodies[attention][":Softmax"]
    assert bodies[attention][":RotaryEmbedding"] == 2  # the standard rotary kept
    layer = _once(bodies, f"{MS}:SkipSimplifiedLayerNormalization")
    assert layer == LAYER_CLASSES["llama"] and calls[layer] == checkpoints.LAYERS
    assert calls[attention] == 1 and not any(k.startswith(MS) for k in main)  # in the layer
    assert sum(bodies[layer].values()) == 5  # norm, attention, the fused add+norm, MLP, add


def test_prefill_and_decode_equal_eager(fp32):
    folder, out = fp32
    errors = decode_and_compare(folder, out, pad=0)
    assert max(errors) < 1e-4, errors


def test_onnxruntime_genai_generates_as_transformers(fp32):
    folder, out = fp32
    ours, logits = og_greedy(out.parent, PROMPT, NEW_TOKENS)
    reference, expected, margin = hf_greedy(folder, PROMPT, NEW_TOKENS, out.parent)
    assert ours == reference, f"smallest top-1 margin {margin:.2e}"
    for step, (got, want) in enumerate(zip(logits, expected, strict=True)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"step {step}")


@pytest.mark.slow  # a bf16 int4 export, its check, and onnxruntime-genai
def test_int4_within_the_stated_bounds_and_generates(tmp_path):
    folder, out = _export(tmp_path, precision="int4", target="onnxruntime",
                          config=dict(dtype=torch.bfloat16))
    _, bodies, _ = _bodies(out)
    _once(bodies, f"{MS}:GroupQueryAttention")
    _once(bodies, f"{MS}:SkipSimplifiedLayerNormalization")
    ids = np.array([[3, 14, 15, 9, 26, 5, 35, 8, 95, 0]], np.int64)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], _feeds(session, ids))[0]
    fake, eager = (_eager(folder, ids, fake_quant=q) for q in (True, False))
    assert np.abs(logits - fake).max() <= FUSED * np.abs(fake).max()
    assert np.abs(logits - eager).max() <= ERROR * np.abs(eager).max()
    assert np.abs(logits - eager).mean() <= MEAN_ERROR * np.abs(eager).mean()
    tokens, steps = og_greedy(out.parent, PROMPT, NEW_TOKENS)
    fake = _eager(folder, np.array([tokens[:-1]], np.int64), fake_quant=True)[0]
    for step, got in enumerate(steps):
        want = fake[len(PROMPT) - 1 + step]
        assert np.abs(got - want).max() <= FUSED * np.abs(want).max(), f"step {step}"


@pytest.mark.slow  # two more exports
def test_a_sliding_window_keeps_the_standard_attention_and_default_writes_none(tmp_path):
    folder, out = _export(tmp_path / "sliding", "mistral", target="onnxruntime",
                          config=dict(sliding_window=4))
    _, bodies, _ = _bodies(out)
    _once(bodies, ":Attention")
    assert _once(bodies, f"{MS}:SkipSimplifiedLayerNormalization")
    assert max(decode_and_compare(folder, out)) < 1e-4
    folder, out = _export(tmp_path / "default")
    main, bodies, _ = _bodies(out)
    _once(bodies, ":Attention")
    assert not [op for ops in [main, *bodies.values()] for op in ops if op.startswith(MS)]
