"""``rewrite export DIR -o OUT.onnx``: OUT's folder is one onnxruntime-genai runs as is.

Per family (small random checkpoints, tests/checkpoints.py, with a tiny BPE tokenizer built
here by the ``tokenizers`` library): ``onnxruntime_genai`` loads the exported folder and
generates, greedy, the same token ids as transformers' ``generate(do_sample=False)`` for 16
new tokens (fp32), fed token ids (no tokenizer in the loop), each step's logits within 1e-4;
``genai_config.json`` says what the checkpoint's config says; the tokenizer files are copied
byte for byte and og's tokenizer reads them. Where no ``genai_config.json`` can be derived
(an encoder, a causal LM without its cache) the model is written without one and a note
says so. The files are published with the model (:mod:`rewrite.files.outputs`): whole, old
or new.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import rewrite
from rewrite.files import outputs
from rewrite.files.outputs import Companion, Staged
from tests import checkpoints
from tests.test_checkpoint_export import Recorder
from tests.test_export_families import hybrid_export

og = pytest.importorskip("onnxruntime_genai")

FAMILIES = ["llama", *(pytest.param(family, marks=pytest.mark.slow) for family in (
    "qwen2", "qwen3", "mistral", "phi3", "gemma2", "qwen2_moe", "gpt2"))]
"""Llama in make test; the other families in make test-all."""
GENAI_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral",
               "phi3": "phi3", "gemma2": "gemma2", "qwen2_moe": "decoder", "gpt2": "decoder"}
"""The runtime's family for each model_type: none for qwen2_moe, and the runtime's gpt2
takes a combined past per layer: the generic decoder."""
PROMPT = [1, 5, 17, 33, 8, 42, 11]
NEW_TOKENS = 16
SPECIAL = ["<unk>", "<s>", "</s>"]


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens, trained here on a tiny
    text (``<s>`` and ``</s>`` are ids 1 and 2, as in the configs), saved by transformers
    with a chat template: tokenizer.json, tokenizer_config.json, chat_template.jinja."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = sorted(set("hello world the cat sat on mat"))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(["hello world, the cat sat on the mat"] * 8, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def exported(request, tmp_path_factory):
    """(family, checkpoint folder, output, progress) of one family's checkpoint with a
    tokenizer, exported once."""
    family = request.param
    root = tmp_path_factory.mktemp(f"genai_{family}")
    folder = checkpoints.write(family, root / "checkpoint")
    write_tokenizer(folder, 96)
    (root / "out").mkdir()
    out = root / "out" / "model.onnx"
    progress = Recorder()
    with hybrid_export():  # torch 2.9 cannot translate a hybrid's state lengths: skipped
        rewrite.export(folder, output=out, progress=progress)
    return family, folder, out, progress


def og_greedy(folder: Path, prompt: list[int], new: int
              ) -> tuple[list[int], list[np.ndarray]]:
    """onnxruntime-genai's greedy continuation of ``prompt`` (token ids), ``new`` tokens
    (the end token held back until then, as ``min_new_tokens`` does), and the logits of
    each step."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = len(prompt) + new
    params.set_search_options(do_sample=False, max_length=length, min_length=length)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    logits = []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits())[0, -1])
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)], logits


def hf_greedy(folder: Path, prompt: list[int], new: int, genai: Path
              ) -> tuple[list[int], list[np.ndarray], float]:
    """transformers' ``generate(do_sample=False)`` of ``prompt`` (fp32), with the end and
    pad ids of the ``genai`` folder's config (held back as og holds them): the tokens, the
    logits of each step and the smallest margin between the first and second logit over the
    new tokens (a tie would make greedy decoding depend on rounding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    ids = torch.tensor([prompt])
    said = json.loads((genai / "genai_config.json").read_text())["model"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new, min_new_tokens=new, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=said["eos_token_id"],
                             pad_token_id=said["pad_token_id"])
    margins = [float(top[0, 0] - top[0, 1]) for top in
               (torch.topk(step, 2).values for step in out.logits)]
    return out.sequences[0].tolist(), [s[0].numpy() for s in out.logits], min(margins)


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_genai_generates_as_transformers(exported):
    family, folder, out, _ = exported
    ours, logits = og_greedy(out.parent, PROMPT, NEW_TOKENS)
    reference, expected, margin = hf_greedy(folder, PROMPT, NEW_TOKENS, out.parent)
    assert len(ours) == len(PROMPT) + NEW_TOKENS
    assert ours == reference, f"{family}: smallest top-1 margin {margin:.2e}"
    for step, (got, want) in enumerate(zip(logits, expected, strict=True)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"step {step}")


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_genai_config_says_what_the_checkpoint_says(exported):
    family, folder, out, progress = exported
    genai = json.loads((out.parent / "genai_config.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    model, decoder = genai["model"], genai["model"]["decoder"]
    assert model["type"] == GENAI_TYPES[family]
    assert decoder["filename"] == "model.onnx"
    heads = config.get("num_attention_heads", config.get("n_head"))
    assert decoder["num_attention_heads"] == heads
    assert decoder["num_key_value_heads"] == config.get("num_key_value_heads", heads)
    assert decoder["num_hidden_layers"] == checkpoints.LAYERS
    assert decoder["hidden_size"] == config.get("hidden_size", config.get("n_embd"))
    assert decoder["head_size"] == config.get("head_dim", decoder["hidden_size"] // heads)
    assert model["context_length"] == config.get("max_position_embeddings",
                                                 config.get("n_positions"))
    assert model["vocab_size"] == config["vocab_size"]
    assert decoder["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "position_ids": "position_ids",
                                 "past_key_names": "past_key_values.%d.key",
                                 "past_value_names": "past_key_values.%d.value"}
    assert decoder["outputs"] == {"logits": "logits",
                                  "present_key_names": "present.%d.key",
                                  "present_value_names": "present.%d.value"}
    assert genai["search"]["past_present_share_buffer"] is False  # the cache grows by Concat
    assert genai["search"]["max_length"] == model["context_length"]
    assert genai["search"]["do_sample"] is False
    assert "onnxruntime-genai runs" in progress.text and "genai_config.json" in progress.text


@pytest.mark.slow  # a tiny hybrid's export, then 16 greedy steps in og and transformers
@pytest.mark.parametrize("exported", ["bamba", "qwen3_next", "jamba"], indirect=True)
def test_a_hybrids_states_are_carried_by_genai(exported):
    """A hybrid whose other layers keep a convolution and a recurrent state (Bamba's Mamba-2
    layers, Qwen3-Next's gated delta nets, Jamba's Mamba layers): the generic ``decoder``,
    its states named as the graph names them; onnxruntime-genai 0.18 generates, greedy,
    what transformers generates, each step's logits within 1e-4."""
    family, folder, out, _ = exported
    genai = json.loads((out.parent / "genai_config.json").read_text())
    decoder = genai["model"]["decoder"]
    assert genai["model"]["type"] == "decoder"
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_recurrent_names"] == "present.%d.recurrent"
    assert (decoder["num_key_value_heads"], decoder["head_size"]) == (2, 8)
    ours, logits = og_greedy(out.parent, PROMPT, NEW_TOKENS)
    reference, expected, margin = hf_greedy(folder, PROMPT, NEW_TOKENS, out.parent)
    assert ours == reference, f"{family}: smallest top-1 margin {margin:.2e}"
    for step, (got, want) in enumerate(zip(logits, expected, strict=True)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"step {step}")


@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_tokenizer_files_are_copied_and_read_by_genai(exported):
    _, folder, out, _ = exported
    names = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    for name in names:
        assert (out.parent / name).read_bytes() == (folder / name).read_bytes(), name
    from tokenizers import Tokenizer

    text = "the cat sat on the mat"
    expected = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    tokenizer = og.Tokenizer(og.Model(str(out.parent)))
    assert list(tokenizer.encode(text)) == expected
    assert tokenizer.decode(np.array(expected, dtype=np.int32)) == text


@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_ids_from_the_generation_config(exported, tmp_path):
    """generation_config.json overrides config.json; the tokenizer's end token joins the end
    ids; the search defaults come from it."""
    _, folder, _, _ = exported
    from transformers import AutoModelForCausalLM

    from rewrite.exporting.checkpoint.cache import cache_layout, causal_lm_call
    from rewrite.exporting.checkpoint.folder import read_checkpoint
    from rewrite.exporting.checkpoint.genai import plan

    copy = tmp_path / "checkpoint"
    shutil.copytree(folder, copy)
    (copy / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [7, 9], "do_sample": True, "temperature": 0.6,
         "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}))
    model = AutoModelForCausalLM.from_pretrained(copy, local_files_only=True)
    layout = cache_layout(model)
    genai = plan(read_checkpoint(copy), model.config, causal_lm_call(model, layout), layout)
    assert genai.config is not None
    model, search = genai.config["model"], genai.config["search"]
    assert model["bos_token_id"] == 1
    assert model["eos_token_id"] == [2, 7, 9]  # </s> of the tokenizer first, as the builder
    assert model["pad_token_id"] == 2
    assert (search["do_sample"], search["temperature"], search["top_p"], search["top_k"],
            search["repetition_penalty"]) == (True, 0.6, 0.9, 20, 1.1)


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_without_a_cache_no_genai_config_and_an_old_one_removed(exported, tmp_path):
    """--cache none: the model is written without genai_config.json (one note line says
    why); one of an earlier run naming the output goes with the old model."""
    _, folder, out, _ = exported
    for name in ("model.onnx", "genai_config.json"):
        shutil.copy(out.parent / name, tmp_path / name)
    progress = Recorder()
    rewrite.export(folder, cache="none", output=tmp_path / "model.onnx", progress=progress)
    assert not (tmp_path / "genai_config.json").exists()
    assert (tmp_path / "tokenizer.json").exists()
    notes = [line for line in progress.text.splitlines() if "genai_config.json" in line]
    assert len(notes) == 1 and "not written" in notes[0] and "--cache none" in notes[0]


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_a_fixed_cache_is_written_without_genai_config(exported, tmp_path):
    """--cache static: onnxruntime-genai on CPU feeds a mask of the tokens so far, where the
    graph takes one per slot; no genai_config.json, one note line."""
    _, folder, _, _ = exported
    progress = Recorder()
    rewrite.export(folder, cache="static", context=32, output=tmp_path / "model.onnx",
                   progress=progress)
    assert not (tmp_path / "genai_config.json").exists()
    notes = [line for line in progress.text.splitlines() if "genai_config.json" in line]
    assert len(notes) == 1 and "not written" in notes[0] and "--cache static" in notes[0]


@pytest.mark.slow
def test_an_encoder_is_written_without_genai_config(tmp_path):
    folder = checkpoints.write("bert", tmp_path / "checkpoint")
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "model.onnx"
    progress = Recorder()
    rewrite.export(folder, output=out, progress=progress)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert "genai_config.json: not written beside model.onnx (not a causal LM" in progress.text


@pytest.mark.slow
def test_exported_into_the_checkpoint_folder_its_tokenizer_is_left_alone(tmp_path):
    """The output beside the checkpoint's own tokenizer files: they are the input, not
    written over."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    write_tokenizer(folder, 96)
    before = {p.name: p.stat().st_ino for p in folder.iterdir()}
    rewrite.export(folder, output=folder / "model.onnx")
    after = {p.name: p.stat().st_ino for p in folder.iterdir()}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"model.onnx", "model.onnx.data", "genai_config.json"}


def _staged(out: Path, version: str, data: bool) -> Staged:
    """A staging folder beside ``out`` holding a model (bytes ``version``), maybe a data
    file, and a companion genai_config.json and tokenizer.json of that version."""
    folder = Path(outputs.tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    (folder / out.name).write_text(f"model {version}")
    names = ()
    first = None
    if data:
        (folder / f"{out.name}.data").write_text(f"data {version}")
        first = folder / f"{out.name}.first"
        first.write_text(f"model {version}")
        names = (f"{out.name}.data",)
    beside = (Companion("genai_config.json", text=f"config {version}"),
              Companion("tokenizer.json", text=f"tokenizer {version}"))
    for companion in beside:
        companion.write(folder)
    return Staged(folder, folder / out.name, first, names,
                  tuple(c.name for c in beside))


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("data", [True, False], ids=["with-data", "embedded"])
def test_companions_are_published_with_the_model(tmp_path, monkeypatch, data):
    """Failing before the commit leaves the old model and companions; publishing leaves the
    new ones; a stale companion goes once the new model is in place."""
    out = tmp_path / "model.onnx"
    outputs.publish(out, _staged(out, "1", data))
    (tmp_path / "chat_template.jinja").write_text("old")
    expected = {"model.onnx": "model 1", "genai_config.json": "config 1",
                "tokenizer.json": "tokenizer 1", "chat_template.jinja": "old"}
    if data:
        expected["model.onnx.data"] = "data 1"
    assert _contents(tmp_path) == expected

    class Stop(Exception):
        pass

    def stop(step: str) -> None:
        if step == "locked":
            raise Stop

    staged = _staged(out, "2", data)
    monkeypatch.setattr(outputs, "_reached", stop)
    with pytest.raises(Stop):
        outputs.publish(out, staged)
    shutil.rmtree(staged.folder)
    assert _contents(tmp_path) == expected
    monkeypatch.undo()
    outputs.publish(out, _staged(out, "3", data), stale=["chat_template.jinja"])
    expected = {k: v.replace("1", "3") for k, v in expected.items()
                if k != "chat_template.jinja"}
    assert _contents(tmp_path) == expected
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


@pytest.mark.slow  # a second family's export and generation
def test_the_cli_writes_the_folder(tmp_path, run_cli):
    """``rewrite export`` writes the same folder, and says so in one line."""
    folder = checkpoints.write("qwen2", tmp_path / "checkpoint")
    write_tokenizer(folder, 96)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "model.onnx"
    r = run_cli("export", folder, "-o", out)
    assert r.code == 0, r
    assert "onnxruntime-genai runs" in r.err, r
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "chat_template.jinja", "genai_config.json", "model.onnx", "model.onnx.data",
        "tokenizer.json", "tokenizer_config.json"]
    assert og_greedy(out.parent, PROMPT, 4)[0] == hf_greedy(folder, PROMPT, 4, out.parent)[0]
