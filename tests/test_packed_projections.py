"""``rewrite export`` packs the projections of one input into one ``MatMul`` per layer body.

Small random checkpoints (tests/checkpoints.py): the attention function's body multiplies
its input once by the query, key and value weights packed (then one ``Split``), the MLP's
once by the gate and up weights packed; once in the whole file (one function per layer
class, called by every layer); the main graph holds one packed weight per layer in place of
the parts; prefill and decode steps in onnxruntime equal eager within 1e-4 (biases too:
Qwen2). int4: the layer body dequantizes four weights instead of seven, the export's own
check passes, and onnxruntime computes what the unpacked int4 model computes.
``--unpacked-projections`` keeps one ``MatMul`` per projection.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rewrite
from rewrite.backends.onnx.finishing._pack import packed_name
from tests import checkpoints
from tests.test_checkpoint_export import LAYER_CLASSES, Recorder
from tests.test_fused_attention import _export, _ops


def _attention_and_mlp(bodies: dict) -> tuple[str, str]:
    attention = next(name for name, ops in bodies.items() if ops["Attention"])
    mlp = next(name for name in bodies if name.endswith("MLP"))
    return attention, mlp


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_qkv_and_gate_up_are_one_matmul_each_once_per_body(family, tmp_path):
    """Packed once per body, every layer calling it, equal to eager (``_export``)."""
    _, out, _ = _export(family, tmp_path)
    main, bodies, calls = _ops(out)
    attention, mlp = _attention_and_mlp(bodies)
    assert bodies[attention]["MatMul"] == 2 and bodies[attention]["Split"] == 1, bodies
    assert bodies[mlp]["MatMul"] == 2 and bodies[mlp]["Split"] == 1, bodies
    assert sum(ops["Split"] for ops in bodies.values()) == 2 and not main["Split"]
    assert calls[LAYER_CLASSES[family]] == checkpoints.LAYERS
    proto = onnx.load(str(out), load_external_data=False)
    names = {init.name for init in proto.graph.initializer}
    packed = [n for n in names if "q_proj+k_proj+v_proj" in n or "gate_proj+up_proj" in n]
    assert len(packed) == 2 * checkpoints.LAYERS, sorted(names)
    assert not any(n.endswith((".q_proj.weight", ".up_proj.weight")) for n in names)


@pytest.mark.slow
def test_unpacked_projections_keep_one_matmul_each(tmp_path, run_cli):
    """``--unpacked-projections``: three and two ``MatMul`` reading the normed input."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    assert run_cli("export", str(folder), "-o", str(out), "--unpacked-projections").code == 0
    _, bodies, _ = _ops(out)
    attention, mlp = _attention_and_mlp(bodies)
    assert bodies[attention]["MatMul"] == 4 and not bodies[attention]["Split"], bodies
    assert bodies[mlp]["MatMul"] == 3 and not bodies[mlp]["Split"], bodies


def _logits(path: Path, steps: int = 3) -> np.ndarray:
    """onnxruntime's logits of a prompt and ``steps`` decode steps (fixed random ids)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    past = {name: np.zeros((2, i.shape[1], 0, i.shape[3]), np.float32)
            for name, i in inputs.items() if name.startswith("past_key_values.")}
    ids = np.random.default_rng(0).integers(0, 100, (2, 7))
    found, length = [], 0
    for _ in range(1 + steps):
        total = length + ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((2, total), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.tile(np.arange(length, total), (2, 1))
        values = dict(zip(outputs, session.run(None, feeds)))
        found.append(values["logits"][:, -1])
        past = {name.replace("present.", "past_key_values."): v for name, v in values.items()
                if name.startswith("present.")}
        ids, length = values["logits"][:, -1:].argmax(-1), total
    return np.stack(found)


@pytest.mark.slow
def test_int4_dequantizes_four_packed_weights_and_computes_what_unpacked_does(tmp_path):
    """int4: q / k / v and gate / up quantized as one weight each (their blocks run along
    the input dimension, so each row is quantized as before): the export's check passes,
    and the logits equal the unpacked int4 model's within 1e-4."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    paths = {}
    for packed in (True, False):
        out = tmp_path / f"out-{packed}" / "model.onnx"
        out.parent.mkdir()
        progress = Recorder()
        rewrite.export(folder, output=out, precision="int4", block_size=16,
                       progress=progress, pack_projections=packed)
        assert "max |difference|" in progress.text
        paths[packed] = out
    _, bodies, _ = _ops(paths[True])
    assert sum(ops["DequantizeLinear"] for ops in bodies.values()) == 4, bodies
    _, unpacked, _ = _ops(paths[False])
    assert sum(ops["DequantizeLinear"] for ops in unpacked.values()) == 7, unpacked
    assert np.abs(_logits(paths[True]) - _logits(paths[False])).max() < 1e-4


@pytest.mark.parametrize(("names", "expected"), [
    (["a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight"], "a.q_proj+k_proj+v_proj.weight"),
    (["gate.weight", "up.weight"], "gate+up.weight"),
    (["x", "y"], "x+y")])
def test_packed_names(names, expected):
    assert packed_name(names) == expected
