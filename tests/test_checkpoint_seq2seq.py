"""``rewrite export DIR --cache kv`` of an encoder-decoder: ``encoder_model.onnx`` and
``decoder_model.onnx`` beside each other, one data file; the encoder run once, then greedy
decoding in onnxruntime with both caches gives transformers' ``generate`` tokens and logits;
one function per layer class; a model that disagrees with eager is never written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rewrite
from rewrite.errors import InputError
from tests import checkpoints
from tests.test_checkpoint_export import Recorder

transformers = pytest.importorskip("transformers")

STEPS = 8
LAYERS = {"bart": ({"BartEncoderLayer": checkpoints.LAYERS},
                   {"BartDecoderLayer": checkpoints.LAYERS}),
          "t5": ({"T5Block": 1, "T5Block_1": checkpoints.LAYERS - 1},) * 2,
          "whisper": ({"WhisperEncoderLayer": checkpoints.LAYERS},
                      {"WhisperDecoderLayer": checkpoints.LAYERS})}
"""The encoder's and the decoder's layer functions and how often each is called (T5's first
block of each stack computes the position bias the others take: two functions, rightly)."""


@pytest.fixture(scope="module", params=["bart", "t5", "whisper"])
def pair(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(family, checkpoint folder, output folder) of one family exported with --cache kv."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = checkpoints.write(family, root / "checkpoint")
    (folder / "tokenizer_config.json").write_text("{}\n")  # copied beside the graphs
    out = root / "out"
    out.mkdir()
    progress = Recorder()
    rewrite.export(folder, output=out / "model.onnx", cache="kv", progress=progress)
    SAID[family] = progress.text
    return family, folder, out


SAID: dict[str, str] = {}
"""What each family's export said (its progress), by family."""


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _eager(family: str, folder: Path) -> torch.nn.Module:
    model_class = getattr(transformers, {**checkpoints.ENCODERS, **checkpoints.AUDIO}[family][2])
    return model_class.from_pretrained(folder, local_files_only=True).eval()


def _prompt(family: str) -> dict[str, np.ndarray]:
    """The encoder's inputs: two rows of 7 tokens, the second padded at its end; or two
    rows of Whisper's frames."""
    generator = torch.Generator().manual_seed(5)
    if family in checkpoints.AUDIO:
        return {"input_features": torch.randn(2, 8, 32, generator=generator).numpy()}
    ids = torch.randint(3, 96, (2, 7), generator=generator).numpy()
    mask = np.ones((2, 7), np.int64)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _greedy(out: Path, prompt: dict[str, np.ndarray], start: int
            ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """The encoder once, then :data:`STEPS` greedy decoder steps in onnxruntime: (tokens,
    each step's logits, the encoder's states)."""
    (states,) = _session(out / "encoder_model.onnx").run(None, prompt)
    decoder = _session(out / "decoder_model.onnx")
    names = [o.name for o in decoder.get_outputs()]
    batch = len(states)
    feeds = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
             for i in decoder.get_inputs() if i.name.startswith("past_")}
    fixed = {"encoder_hidden_states": states}
    if "attention_mask" in prompt:
        fixed["encoder_attention_mask"] = prompt["attention_mask"]
    token = np.full((batch, 1), start, np.int64)
    tokens, logits = [], []
    for _ in range(STEPS):
        got = dict(zip(names, decoder.run(None, {**feeds, **fixed, "input_ids": token})))
        logits.append(got["logits"][:, -1])
        token = got["logits"][:, -1:].argmax(-1)
        tokens.append(token)
        feeds = {name: got[name.replace("past_key_values", "present")] for name in feeds}
    return np.concatenate(tokens, axis=1), logits, states


@pytest.mark.slow
def test_greedy_decoding_equals_generate(pair):
    family, folder, out = pair
    eager = _eager(family, folder)
    prompt = _prompt(family)
    given = {name: torch.from_numpy(value) for name, value in prompt.items()}
    with torch.no_grad():
        want_states = eager.get_encoder()(**given)
        generated = eager.generate(
            **given, do_sample=False, num_beams=1, max_new_tokens=STEPS, min_new_tokens=STEPS,
            forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0,
            output_logits=True, return_dict_in_generate=True)
    start = int(generated.sequences[0, 0])  # the decoder's start token, as generate has it
    tokens, logits, states = _greedy(out, prompt, start)
    np.testing.assert_allclose(states, want_states.last_hidden_state.numpy(), atol=1e-4)
    np.testing.assert_array_equal(tokens, generated.sequences[:, 1:].numpy())
    assert len(generated.logits) == STEPS
    for step, (got, want) in enumerate(zip(logits, generated.logits)):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4,
                                   err_msg=f"step {step}")


@pytest.mark.slow
def test_two_graphs_one_data_file_each_tensor_once(pair):
    family, folder, out = pair
    assert sorted(p.name for p in out.iterdir()) == [
        "decoder_model.onnx", "decoder_model.onnx.data", "encoder_model.onnx",
        "tokenizer_config.json"]
    places = {}
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        onnx.checker.check_model(str(out / name), full_check=True)
        model = onnx.load(str(out / name), load_external_data=False)
        for tensor in model.graph.initializer:
            entries = {e.key: e.value for e in tensor.external_data}
            if entries:
                assert entries["location"] == "decoder_model.onnx.data"
                places.setdefault((entries["offset"], entries["length"]), set()).add(name)
    shared = [where for where, names in places.items() if len(names) == 2]
    eager = _eager(family, folder)
    encoder = {p.data_ptr() for p in eager.get_encoder().parameters()}
    both = [p for p in eager.get_decoder().parameters() if p.data_ptr() in encoder]
    assert len(shared) == len(both)  # BART's and T5's embedding, written once; Whisper: none
    size = (out / "decoder_model.onnx.data").stat().st_size
    assert size <= sum(int(length) for _, length in places) + 65536 * len(places)


@pytest.mark.slow
def test_one_function_per_layer_class_taking_both_caches(pair):
    family, _, out = pair
    for name, layers in zip(("encoder_model.onnx", "decoder_model.onnx"), LAYERS[family]):
        model = onnx.load(str(out / name), load_external_data=False)
        for layer, count in layers.items():
            assert [f.name for f in model.functions].count(layer) == 1, layer
            calls = [n for f in model.functions for n in f.node if n.op_type == layer]
            calls += [n for n in model.graph.node if n.op_type == layer]
            assert len(calls) == count, layer
    decoder = onnx.load(str(out / "decoder_model.onnx"), load_external_data=False)
    first = next(n for n in decoder.graph.node if n.op_type in LAYERS[family][1])
    for which in ("decoder", "encoder"):
        assert {f"past_key_values.0.{which}.key", f"past_key_values.0.{which}.value"} <= set(
            first.input)
        assert {f"present.0.{which}.key", f"present.0.{which}.value"} <= set(first.output)


@pytest.mark.slow
def test_each_part_traces_each_distinct_layer_once(pair):
    """The encoder's layers and the decoder step's (each taking its self-attention cache and
    the cross-attention one) traced once per kind, the others recorded as calls of their
    traces: the export's cost flat in the depth of both parts (and, above, one function per
    layer class all the same)."""
    family, _, _ = pair
    traced = {"bart": ("BartEncoderLayer", "BartDecoderLayer"), "t5": ("T5Block x2",) * 2,
              "whisper": ("WhisperEncoderLayer", "WhisperDecoderLayer")}[family]
    if torch.__version__ < (2, 10):  # the decoder traced whole (torch.sym_sum, see there)
        traced = traced[:1]
    for kinds in traced:
        count = kinds.count(" x2") + 1
        said = (f"torch.export: {count} of {checkpoints.LAYERS} layers traced ({kinds}), "
                f"{checkpoints.LAYERS - count} recorded as calls of their traces")
        assert said in SAID[family], SAID[family]
    assert "torch.export traces every layer" not in SAID[family], SAID[family]


@pytest.mark.slow
def test_the_dimensions_are_named(pair):
    family, _, out = pair
    model = onnx.load(str(out / "decoder_model.onnx"), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    assert dims["input_ids"] == ["batch_size", "decoder_sequence_length"]
    if family in checkpoints.AUDIO:  # its decoder attends to every frame
        assert "encoder_attention_mask" not in dims
    else:
        assert dims["encoder_attention_mask"] == ["batch_size", "encoder_sequence_length"]
    assert dims["encoder_hidden_states"][:2] == ["batch_size", "encoder_sequence_length"]
    assert dims["past_key_values.0.decoder.key"][:3] == [
        "batch_size", 4, "past_decoder_sequence_length"]
    assert dims["past_key_values.0.encoder.key"][:3] == [
        "batch_size", 4, "past_encoder_sequence_length"]


@pytest.mark.slow
def test_a_wrong_decoder_is_exit_1_and_nothing_written(tmp_path, run_cli, monkeypatch):
    """A bug that swaps the cross cache's keys and values is caught before publishing:
    neither graph nor the data is written."""
    from rewrite.exporting import module

    real = module.rename_values

    def swapped(model, input_names, output_names):
        names = list(output_names)
        if "present.0.encoder.key" in names:
            k, v = names.index("present.0.encoder.key"), names.index("present.0.encoder.value")
            names[k], names[v] = names[v], names[k]
        real(model, input_names, names)

    monkeypatch.setattr(module, "rename_values", swapped)
    folder = checkpoints.write("bart", tmp_path / "checkpoint")
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("export", folder, "-o", out / "model.onnx", "--cache", "kv")
    assert r.code == 1, r.err
    assert "disagrees with eager PyTorch: present.0.encoder." in r.err
    assert not list(out.iterdir())


def test_the_command_says_what_it_wrote(tmp_path, run_cli, monkeypatch):
    """The two graphs' names, not the ``-o`` file's (the export itself replaced: this is
    about the command's words)."""
    folder = checkpoints.write("bart", tmp_path / "checkpoint")
    monkeypatch.setattr(rewrite, "export", lambda *args, **kwargs: None)
    r = run_cli("export", folder, "-o", tmp_path / "model.onnx", "--cache", "kv")
    assert r.code == 0, r.err
    assert (f"wrote {tmp_path / 'encoder_model.onnx'} and "
            f"{tmp_path / 'decoder_model.onnx'}") in r.err + r.out


def test_a_fixed_cache_is_refused_for_an_encoder_decoder(tmp_path):
    folder = checkpoints.write("bart", tmp_path / "checkpoint")
    with pytest.raises(InputError, match="not a causal language model: --cache static"):
        rewrite.export(folder, output=tmp_path / "model.onnx", cache="static", context=16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_whisper_needs_the_two_graphs(tmp_path):
    """Its prefill graph would take input_features, which --cache none does not: refused in
    one line that says what is taken."""
    folder = checkpoints.write("whisper", tmp_path / "checkpoint")
    with pytest.raises(InputError, match="with --cache kv, encoder-decoders over "
                                         "input_features"):
        rewrite.export(folder, output=tmp_path / "model.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_missing_output_folder_or_chunks_are_refused_before_loading(tmp_path, run_cli):
    folder = checkpoints.write("bart", tmp_path / "checkpoint")
    r = run_cli("export", folder, "-o", tmp_path / "model.onnx", "--cache", "kv",
                "--weights-chunk", "1000000")
    assert r.code == 2 and "share one data file, which is not chunked" in r.err, r.err
    r = run_cli("export", folder, "-o", tmp_path / "missing" / "model.onnx", "--cache", "kv")
    assert r.code == 2, r.err
    assert "encoder_model.onnx: cannot write there: folder" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.slow
def test_later_steps_read_the_cross_cache_not_the_encoder_states(pair):
    """Past the first step the cross keys and values come from past_key_values.N.encoder:
    the encoder's states fed then do not change the logits (they are not projected again)."""
    family, _, out = pair
    prompt = _prompt(family)
    (states,) = _session(out / "encoder_model.onnx").run(None, prompt)
    decoder = _session(out / "decoder_model.onnx")
    names = [o.name for o in decoder.get_outputs()]
    fixed = {"encoder_attention_mask": prompt["attention_mask"]} \
        if "attention_mask" in prompt else {}
    feeds = {i.name: np.zeros((len(states), i.shape[1], 0, i.shape[3]), np.float32)
             for i in decoder.get_inputs() if i.name.startswith("past_")}
    token = np.zeros((len(states), 1), np.int64)
    first = dict(zip(names, decoder.run(None, {**feeds, **fixed, "input_ids": token,
                                               "encoder_hidden_states": states})))
    feeds = {name: first[name.replace("past_key_values", "present")] for name in feeds}
    token = first["logits"][:, -1:].argmax(-1)
    runs = [dict(zip(names, decoder.run(None, {**feeds, **fixed, "input_ids": token,
                                               "encoder_hidden_states": given})))
            for given in (states, np.random.default_rng(0).normal(size=states.shape)
                          .astype(np.float32))]
    np.testing.assert_array_equal(runs[0]["logits"], runs[1]["logits"])
    assert not np.array_equal(first["logits"], runs[0]["logits"])
