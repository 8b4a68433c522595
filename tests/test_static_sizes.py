"""``--static batch=1,seq=4,seq=1`` (issue 41 item 2): one model per chunk length,
``model.onnx`` (the first) and ``model_seq1.onnx`` beside it, both reading one data file
that holds each weight once. A prompt fed in chunks of 4 through the chunk model, then
decode steps through the one-token model, passing the buffers from one to the other, equals
the eager model (1e-4) in onnxruntime; every value of each model static; one function per
layer class in each; a chunk asked twice or longer than the context refused, nothing
written; an earlier run's model of a chunk length no longer asked removed with the data it
read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.backends.onnx.shared_data import external_places
from tests import checkpoints
from tests.test_fixed_cache import LAYERS, _eager

CONTEXT, CHUNK, PROMPT, DECODE = 16, 4, 10, 5
FAMILIES = ["llama", pytest.param("gemma2", marks=pytest.mark.slow)]
"""Llama in make test; Gemma-2 (sliding and global layers) in make test-all."""


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"{family}-sizes")
    folder = checkpoints.write(family, root / "checkpoint")
    out = root / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, cache="static", context=CONTEXT,
                   static={"batch": 1, "seq": [CHUNK, 1]})
    return family, folder, out


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _step(session, buffers: dict, tokens: np.ndarray, start: int, real: int) -> np.ndarray:
    """One call: ``tokens`` at positions ``start...``, the first ``real`` of them real (the
    rest fill the chunk: position -1, dropped); ``buffers`` updated; the logits."""
    width, context = tokens.shape[1], next(iter(buffers.values())).shape[2]
    positions = np.where(np.arange(width) < real, start + np.arange(width), -1)[None]
    mask = (np.arange(context) < start + real).astype(np.int64)[None]
    outputs = session.run(None, {"input_ids": tokens.astype(np.int64), "attention_mask": mask,
                                 "position_ids": positions, **buffers})
    result = dict(zip([o.name for o in session.get_outputs()], outputs))
    buffers.update({k.replace("present", "past_key_values"): v for k, v in result.items()
                    if k.startswith("present.")})
    return result["logits"]


def _assert_chunks_then_decode_equal_eager(folder: Path, out: Path, context: int) -> None:
    """The prompt (10 tokens: chunks of 4, 4 and 2 real) through ``out``, then greedy decode
    steps through ``out``'s ``_seq1`` model on the same buffers, equal to eager (1e-4)."""
    from rewrite.exporting.checkpoint.cache import cache_layout

    eager = _eager(folder)
    chunked, single = _session(out), _session(out.with_name(f"{out.stem}_seq1.onnx"))
    buffers = {}
    for n, layer in enumerate(cache_layout(eager)):
        key, value = layer.empty(1, context)
        buffers[f"past_key_values.{n}.key"] = key.numpy()
        buffers[f"past_key_values.{n}.value"] = value.numpy()
    ids = torch.randint(0, eager.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(5)).numpy()
    got = []
    for start in range(0, PROMPT, CHUNK):
        real = min(CHUNK, PROMPT - start)
        chunk = np.zeros((1, CHUNK), np.int64)
        chunk[:, :real] = ids[:, start:start + real]
        got.append(_step(chunked, buffers, chunk, start, real)[:, :real])
    for step in range(DECODE):
        token = got[-1][:, -1:].argmax(-1)
        got.append(_step(single, buffers, token, PROMPT + step, 1))
    logits = np.concatenate(got, axis=1)[0]
    generated = logits[PROMPT - 1:-1].argmax(-1)
    sequence = torch.cat([torch.from_numpy(ids), torch.from_numpy(generated)[None]], 1)
    with torch.no_grad():
        want = eager(input_ids=sequence).logits[0].numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)


def test_chunks_then_decode_steps_equal_eager(exported):
    _, folder, out = exported
    _assert_chunks_then_decode_equal_eager(folder, out, CONTEXT)


def test_the_models_read_one_data_file_holding_each_weight_once(exported):
    _, folder, out = exported
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "model.onnx", "model.onnx.data", "model_seq1.onnx"]
    first, single = external_places(out), external_places(out.with_name("model_seq1.onnx"))
    assert first and single == first  # every weight of the one-token model is the first's
    assert {location for location, _, _ in first.values()} == {"model.onnx.data"}
    spans = sorted((offset, offset + length) for _, offset, length in first.values())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap
    assert (out.parent / "model.onnx.data").stat().st_size == spans[-1][1]
    eager = _eager(folder)
    weights = {p.data_ptr(): p.numel() * p.element_size() for p in eager.parameters()}
    big = sum(n for n in weights.values() if n > 1024)
    assert sum(end - start for start, end in spans) == big  # the checkpoint's, once


def test_every_value_static_and_one_function_per_layer_class(exported, run_cli):
    family, _, out = exported
    for path, seq in ((out, CHUNK), (out.with_name("model_seq1.onnx"), 1)):
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), data_prop=True)
        values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
        symbolic = [v.name for v in values if any(
            not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)]
        assert not symbolic, (path.name, symbolic[:5])
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in values}
        assert shapes["input_ids"] == [1, seq] and shapes["attention_mask"] == [1, CONTEXT]
        layers = [n for n in model.graph.node if n.op_type == LAYERS[family]]
        assert len(layers) == checkpoints.LAYERS
        assert sum(f.name == LAYERS[family] for f in model.functions) == 1
        r = run_cli("check-static", path)
        assert r.code == 0, r.out


def test_both_models_grouped_alike(exported):
    _, _, out = exported
    functions = [sorted((f.domain, f.name) for f in onnx.load(
        str(path), load_external_data=False).functions)
        for path in (out, out.with_name("model_seq1.onnx"))]
    assert functions[0] == functions[1] and functions[0]


@pytest.mark.parametrize("sizes, more, message", [
    ("batch=1,seq=4,seq=4", [], "--static asks seq=4 twice"),
    ("batch=1,seq=4,seq=20", [], "the chunk (20 tokens) is longer than the context (16)"),
    ("batch=1,seq=4,seq=1", ["--external-data", "never"], "share one data file"),
])
def test_bad_chunk_lengths_one_line_nothing_written(sizes, more, message, tmp_path,
                                                    run_cli):
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    r = run_cli("export", folder, "-o", out, "--cache", "static", "--context", CONTEXT,
                "--static", sizes, *more)
    assert r.code == 2 and r.err.strip().count("\n") == 0 and message in r.err, r.err
    assert not list(out.parent.iterdir())


@pytest.mark.slow
def test_a_chunk_length_no_longer_asked_is_removed(tmp_path):
    """Exported again with seq=4,seq=2 then with seq=4 only: model_seq1.onnx (then
    model_seq2.onnx), which read the data now replaced, goes; a file of that form that
    is not such a model stays."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    (out.parent / "model_seq9.onnx").write_text("a file of the user's")

    def export(seq) -> list[str]:
        rewrite.export(folder, output=out, cache="static", context=CONTEXT, verify=False,
                       static={"batch": 1, "seq": seq})
        return sorted(p.name for p in out.parent.iterdir())

    assert export([4, 1]) == ["model.onnx", "model.onnx.data", "model_seq1.onnx",
                              "model_seq9.onnx"]
    assert export([4, 2]) == ["model.onnx", "model.onnx.data", "model_seq2.onnx",
                              "model_seq9.onnx"]
    assert export(4) == ["model.onnx", "model.onnx.data", "model_seq9.onnx"]


def test_several_lengths_without_an_output_refused(tmp_path):
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    with pytest.raises(rewrite.InputError, match="write one model each beside the output"):
        rewrite.export(folder, cache="static", context=CONTEXT, static={"seq": [4, 1]})


WIDE = 160
"""A context whose slot indices (160 int64: 1280 bytes) are a constant of the data file."""


@pytest.mark.slow
def test_weights_written_early_kept_and_the_constants_appended(tmp_path, monkeypatch):
    """The checkpoint's weights are written while torch.export runs (the weights are small,
    so ``external_data_threshold=0``); the graph's constants over 1 KB (the slot indices of
    the context) are appended after them, the early data kept (never discarded and written
    again; a packed q / k / v or gate / up weight refers to its parts written end to end):
    the data file holds each weight once, then the constants, nothing else; both models read
    it and equal eager."""
    from rewrite.backends.onnx.early_data import EarlyData
    from rewrite.backends.onnx.packed import PackedWeight
    from tests.test_mapped_weights import DAY_NS, Recorder

    discarded, discard = [], EarlyData.discard
    monkeypatch.setattr(EarlyData, "discard",
                        lambda self: (discarded.append(self.name), discard(self)))
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    past = time.time_ns() - DAY_NS  # written before the process started, as a user's are
    for path in folder.iterdir():
        os.utime(path, ns=(past, past))
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    progress = Recorder()
    model = rewrite.export(folder, output=out, cache="static", context=WIDE, progress=progress,
                           static={"batch": 1, "seq": [CHUNK, 1]}, external_data_threshold=0)
    note = next(n for n in progress.notes if n.startswith("weights:"))
    assert "written while exporting" in note and not discarded, note
    first = external_places(out)
    assert external_places(out.with_name("model_seq1.onnx")) == first
    eager = _eager(folder)
    names = {name for name, t in eager.state_dict().items() if t.nbytes > 1024} | {
        name for name, v in model.graph.initializers.items()  # q / k / v, gate / up packed:
        if isinstance(v.const_value, PackedWeight)}  # their parts' bytes, end to end
    weights = sorted(place[1:] for name, place in first.items() if name in names)
    made = sorted(place[1:] for name, place in first.items() if name not in names)
    assert {p.data_ptr() for p in eager.parameters() if p.nbytes > 1024} and made
    big = sum(p.nbytes for p in {p.data_ptr(): p for p in eager.parameters()}.values()
              if p.nbytes > 1024)
    assert sum(length for _, length in weights) == big  # each weight once, at the front
    assert weights[-1][0] + weights[-1][1] <= made[0][0]
    assert sum(length for _, length in made) >= WIDE * 8
    assert (out.parent / "model.onnx.data").stat().st_size == sum(
        length for _, length in (*weights, *made))  # packed: nothing written twice
    _assert_chunks_then_decode_equal_eager(folder, out, WIDE)
