"""``rewrite export DIR``: a checkpoint folder in, grouped decode-ready ONNX out.

Per family (small random checkpoints written by ``save_pretrained``, tests/checkpoints.py):
prefill plus 3 decode steps in onnxruntime, ``present`` fed back as ``past``, equal to eager
PyTorch's logits (transformers' own cache) within 1e-4, one row left-padded; one function per
decoder-layer class; the weights byte-equal to the shards and views of their mappings.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from rich.console import Console
from safetensors import safe_open

import rewrite
from rewrite.cli.steps import Steps
from rewrite.exporting.checkpoint.cache import cache_layout, model_cache, new_tokens_mask
from tests import checkpoints

DECODE_STEPS = 3
PROMPT = 5
PAD = 2

LAYER_CLASSES = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer",
                 "qwen3": "Qwen3DecoderLayer",
                 "mistral": "MistralDecoderLayer", "phi3": "Phi3DecoderLayer",
                 "gemma2": "Gemma2DecoderLayer", "gpt2": "GPT2Block",
                 "qwen2_moe": "Qwen2MoeDecoderLayer"}


class Recorder(Steps):
    """The CLI's progress (``Steps``) drawing into a string (``text``); the steps, in order."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        self.steps: list[str] = []
        super().__init__(Console(file=self.buffer, width=200), spinner=False,
                         finished=lambda text, seconds: self.steps.append(text))

    @property
    def text(self) -> str:
        return self.buffer.getvalue()


@pytest.fixture(scope="module")
def exported(request, tmp_path_factory):
    """(family, folder, ONNX path, onnx_ir model, progress) of one family's checkpoint,
    exported once."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = checkpoints.write(family, root / "checkpoint",
                               shard="20KB" if family == "llama" else None)
    out = root / "model.onnx"
    progress = Recorder()
    model = rewrite.export(folder, output=out, progress=progress)
    return family, folder, out, model, progress


def _feed(ids, mask, positions, past) -> dict:
    """The inputs; ``past``: per layer (key, value), or the cache by name."""
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
            "position_ids": positions.numpy()}
    if isinstance(past, dict):
        return {**feed, **past}
    for n, (key, value) in enumerate(past):
        feed[f"past_key_values.{n}.key"] = key
        feed[f"past_key_values.{n}.value"] = value
    return feed


def _eager(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def decode_and_compare(folder: Path, onnx_path: Path, batch: int = 3, pad: int = PAD,
                       prompt: int = PROMPT, steps: int = DECODE_STEPS) -> list[float]:
    """Prefill of ``prompt`` tokens and ``steps`` greedy steps in both, the first row
    left-padded by ``pad`` tokens; the max |difference| of each step (the padded positions'
    logits excluded). Batch, sequence and past lengths all differ from the example inputs of
    the export."""
    eager = _eager(folder)
    layout = cache_layout(eager)  # per layer: keys and values may differ (MLA), a hybrid's
    pairs = {past: present for n, layer in enumerate(layout)  # layers keep a conv state
             for past, present in zip(layer.names(n), layer.names(n, present=True))}
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    torch.manual_seed(1)
    ids = torch.randint(0, eager.config.vocab_size, (batch, prompt))
    mask = torch.ones(batch, prompt, dtype=torch.long)
    mask[0, :pad] = 0
    past = {name: t.numpy() for n, layer in enumerate(layout)
            for name, t in zip(layer.names(n), layer.past(batch, 0))}
    cache, errors = model_cache(eager), []  # MiniMax's a class of its own
    new_only = new_tokens_mask(layout)
    for _ in range(1 + steps):
        length = ids.shape[1]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -length:]
        with torch.no_grad():  # Mamba reads the mask of the new tokens alone
            reference = eager(input_ids=ids, position_ids=positions, cache=cache,
                              attention_mask=mask[:, -length:] if new_only else mask,
                              use_cache=True).logits
        outputs = dict(zip(names, session.run(None, _feed(ids, mask, positions, past))))
        kept = slice(pad if length == prompt else 0, None)
        errors.append(float(np.abs(outputs["logits"] - reference.numpy())[:, kept].max()))
        past = {name: outputs[present] for name, present in pairs.items()}
        assert all(v.shape[2] == mask.shape[1] for k, v in past.items() if k.endswith(".key"))
        ids = reference[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1)
    return errors


FAST = ("llama",)
"""The family make test runs; the others (one more code path each: GPT-2's own attention,
sliding windows, MoE, soft-capping...) are marked slow: make test-all and CI run them."""
FAMILIES = [family if family in FAST else pytest.param(family, marks=pytest.mark.slow)
            for family in LAYER_CLASSES]


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_prefill_and_decode_equal_eager(exported):
    family, folder, out, model, progress = exported
    # each distinct layer lowered once; the cache's empty start (``torch.tensor``'s
    # ``detach_``) needs no functional form of the whole program (the MoE's expert loop
    # writes in place: ``index_put_``)
    assert "lowered the flat program" not in progress.text
    functional = any("functionalizing" in step for step in progress.steps)
    assert functional == (family == "qwen2_moe"), progress.steps
    errors = decode_and_compare(folder, out)
    assert max(errors) < 1e-4, errors
    onnx.checker.check_model(str(out), full_check=True)
    inputs = [v.name for v in model.graph.inputs]
    outputs = [v.name for v in model.graph.outputs]
    layers = checkpoints.LAYERS
    assert inputs == ["input_ids", "attention_mask", "position_ids",
                      *[f"past_key_values.{n}.{kv}" for n in range(layers)
                        for kv in ("key", "value")]]
    assert outputs == ["logits", *[f"present.{n}.{kv}" for n in range(layers)
                                   for kv in ("key", "value")]]


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_one_function_per_decoder_layer_class(exported):
    family, _, _, model, _ = exported
    layer = LAYER_CLASSES[family]
    calls = [node for node in model.graph if node.op_type.startswith(layer)]
    assert len(calls) == checkpoints.LAYERS
    assert len({(c.domain, c.op_type, c.overload) for c in calls}) == 1
    function = model.functions[calls[0].op_identifier()]
    # the layer's cache in, the updated one out: (hidden, key, value) per call
    assert len(function.outputs) == 3
    assert all(len(c.outputs) == 3 for c in calls)
    for n, call in enumerate(calls):  # layer n's call reads its past, returns its present
        names = {v.name for v in call.inputs if v is not None}
        assert {f"past_key_values.{n}.key", f"past_key_values.{n}.value"} <= names
        assert {f"present.{n}.key", f"present.{n}.value"} <= {v.name for v in call.outputs}


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_dimensions_carry_the_names_decoders_use(exported):
    """The names of onnxruntime-genai's builder and optimum, in the file."""
    family, folder, out, _, _ = exported
    saved = onnx.load(str(out), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*saved.graph.input, *saved.graph.output]}
    layout = cache_layout(_eager(folder))
    kv_heads, head_dim = layout[0].key_heads, layout[0].key_dim
    tokens = ["batch_size", "sequence_length"]
    assert dims["input_ids"] == dims["position_ids"] == tokens
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["logits"][:2] == tokens
    for n in range(checkpoints.LAYERS):
        for kv in ("key", "value"):
            assert dims[f"past_key_values.{n}.{kv}"] == [
                "batch_size", kv_heads, "past_sequence_length", head_dim]
            assert dims[f"present.{n}.{kv}"] == [
                "batch_size", kv_heads, "past_sequence_length + sequence_length", head_dim]


def _aliases(folder: Path) -> dict[str, set[str]]:
    """Parameter name -> every name of the same tensor (tied weights: an LM head sharing
    the token embedding is written under either name)."""
    names: dict[int, set[str]] = {}
    for name, parameter in _eager(folder).named_parameters(remove_duplicate=False):
        names.setdefault(parameter.data_ptr(), set()).add(name)
    return {name: group for group in names.values() for name in group}


FUSED_ON_LOAD = ".mlp.experts."
"""transformers 5 fuses a MoE's per-expert weights into one tensor per layer when it loads
them (``gate_up_proj``, ``down_proj``): that tensor is a new one (concatenated), not a range
of a shard, so those weights are not compared by name."""


def _packed_parts(model: ir.Model) -> dict[str, tuple[str, int, int, int, object]]:
    """Each weight the export packed with others (q / k / v, gate / up) -> the packed
    initializer's name, the axis, its bounds along it, its own tensor."""
    from rewrite.backends.onnx.packed import PackedWeight

    found = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if isinstance(tensor, PackedWeight):
            for (part, (start, stop)), own in zip(tensor.bounds().items(), tensor.parts):
                found[part] = (name, tensor.axis, start, stop, own)
    return found


def _written(initializers, parts: dict, name: str) -> np.ndarray:
    """The bytes written for the weight ``name``: its initializer, or its rows of the packed
    one holding it."""
    if name in initializers:
        return initializers[name].const_value.numpy()
    packed, axis, start, stop, _ = parts[name]
    return np.ascontiguousarray(np.take(initializers[packed].const_value.numpy(),
                                        range(start, stop), axis=axis))


@pytest.mark.parametrize("exported", FAMILIES, indirect=True)
def test_weights_byte_equal_to_the_shards(exported):
    """Every weight of the shards is written as it is, alone or as rows of a packed one."""
    family, folder, out, model, progress = exported
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) > 1 or family != "llama"  # the fixture's llama is sharded
    initializers = ir.load(str(out)).graph.initializers
    aliases, parts = _aliases(folder), _packed_parts(model)
    compared = 0
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                if FUSED_ON_LOAD in name:
                    continue
                found = [n for n in aliases.get(name, {name}) if n in initializers or n in parts]
                assert found, name
                got = _written(initializers, parts, found[0])
                assert got.tobytes() == f.get_tensor(name).numpy().tobytes(), name
                compared += 1
    assert compared >= 4 * checkpoints.LAYERS
    if family != "llama":
        return
    # each step reported, and which rules were chosen
    assert progress.steps[:2] == [f"loading {folder}",
                                  "exporting LlamaForCausalLM with torch.export"]
    assert progress.steps[-1] == f"writing {out}"
    assert progress.text.startswith("rules: llama.rules, shipped for model_type 'llama'\n")


@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_the_weights_go_to_the_data_file_whatever_their_size(exported):
    """A checkpoint's export is a deployment laid out as onnxruntime-genai's builder lays its
    out: even a tiny model's weights are in ``model.onnx.data`` (onnxruntime maps that
    file), only tensors of at most 1 KiB inline."""
    _, _, out, _, _ = exported
    data = out.with_name("model.onnx.data")
    assert data.stat().st_size > 0
    proto = onnx.load(str(out), load_external_data=False)
    inline = [t.name for t in proto.graph.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) > 1024]
    assert not inline
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL
               for t in proto.graph.initializer) >= 4 * checkpoints.LAYERS


@pytest.mark.slow  # a second export
def test_external_data_never_embeds_a_checkpoints_weights(tmp_path):
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, external_data_threshold=2**63)
    assert sorted(p.name for p in out.parent.iterdir()) == ["genai_config.json", "model.onnx"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert "logits" in [o.name for o in session.get_outputs()]


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2_moe", "deepseek_v3"])
def test_only_a_model_with_experts_takes_transformers_moe_translations(family):
    """transformers' ONNX exporter (its grouped-matmul translations) is imported for a model
    with MoE experts only (its import costs a dense export ~0.3 s); the MoE families'
    exports above and in test_export_families fail to lower without it."""
    import transformers

    from rewrite._private.transformers_onnx import has_experts

    name, settings = {**checkpoints.FAMILIES, **checkpoints.OTHER_DECODERS}[family]
    config = getattr(transformers, name)(**settings)
    model = checkpoints.architecture(config)(config)
    assert has_experts(model) == (family in ("qwen2_moe", "deepseek_v3"))


@pytest.mark.slow
def test_a_bf16_checkpoint_keeps_bf16_weights_and_cache(tmp_path):
    """dtype "auto": the weights stay bf16, byte for byte, and so does the KV cache's I/O."""
    folder = checkpoints.write("llama", tmp_path / "bf16", dtype=torch.bfloat16)
    out = tmp_path / "model.onnx"
    switches = ("TRANSFORMERS_SDPA_FORCE_GQA", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    before = {key: os.environ.get(key) for key in switches}
    model = rewrite.export(folder, output=out)
    # the process's environment as it was (the export sets transformers' switches for itself)
    assert {key: os.environ.get(key) for key in switches} == before
    onnx.checker.check_model(str(out), full_check=True)
    kv = [v for v in [*model.graph.inputs, *model.graph.outputs]
          if v.name.startswith(("past_key_values.", "present."))]
    assert len(kv) == 4 * checkpoints.LAYERS
    assert {v.dtype for v in kv} == {ir.DataType.BFLOAT16}
    initializers = ir.load(str(out)).graph.initializers
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = [name for name in f.keys() if name in initializers]
        for name in names:
            got = initializers[name].const_value.tobytes()
            assert got == f.get_tensor(name).view(torch.uint8).numpy().tobytes(), name
    assert len(names) >= 4 * checkpoints.LAYERS


@pytest.mark.slow
def test_prefill_only_with_suggested_rules(tmp_path, monkeypatch):
    """--cache none: logits only; no shipped rules: the suggested ones, sent as a note."""
    import rewrite.exporting.checkpoint

    monkeypatch.setattr(rewrite.exporting.checkpoint, "default_rules", lambda checkpoint: None)
    folder = checkpoints.write("gpt2", tmp_path / "gpt2")
    progress = Recorder()
    model = rewrite.export(folder, output=tmp_path / "prefill.onnx", cache="none",
                           progress=progress)
    assert [v.name for v in model.graph.inputs] == ["input_ids", "attention_mask",
                                                     "position_ids"]
    assert [v.name for v in model.graph.outputs] == ["logits"]
    suggested = progress.text[progress.text.index("# Starter rules"):]
    assert suggested.startswith("# Starter rules for GPT2LMHeadModel")
    assert "\ngroup class GPT2Block " in suggested
    assert "\non cycle flatten\n" in suggested  # never a stop on a model torch exported
    blocks = [node for node in model.graph if node.op_type.startswith("GPT2Block")]
    assert len(blocks) == checkpoints.LAYERS and len({n.op_type for n in blocks}) == 1
    ids = torch.randint(0, 96, (2, PROMPT))
    mask = torch.ones_like(ids)
    positions = torch.arange(PROMPT).repeat(2, 1)
    with torch.no_grad():
        reference = _eager(folder)(input_ids=ids, attention_mask=mask,
                                   position_ids=positions).logits.numpy()
    session = ort.InferenceSession(str(tmp_path / "prefill.onnx"),
                                   providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, _feed(ids, mask, positions, []))
    assert np.abs(logits - reference).max() < 1e-4


def _mapped_ranges(folder: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of files in ``folder``."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and Path(parts[5]).parent == folder:
                low, high = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((low, high))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only")
@pytest.mark.parametrize("exported", ["llama"], indirect=True)
def test_weights_stay_views_of_the_mapped_shards(exported):
    """Nothing copied the weights: the returned model's initializers (and the parts of a
    packed one, concatenated when written) are torch tensors over the shards' file mappings
    (what lets the writer copy them file to file)."""
    _, folder, _, model, _ = exported
    ranges, parts = _mapped_ranges(folder), _packed_parts(model)
    with safe_open(str(sorted(folder.glob("*.safetensors"))[0]), "pt") as f:
        names = list(f.keys())
    for name in names:
        own = parts[name][-1] if name in parts else model.graph.initializers[name].const_value
        tensor = own.raw
        assert isinstance(tensor, torch.Tensor), name
        assert any(low <= tensor.data_ptr() < high for low, high in ranges), name


@pytest.mark.slow  # a second decode export, saved and read back
def test_the_decode_program_converts_from_its_saved_file_as_in_memory(tmp_path):
    """The program ``rewrite export`` makes, saved by ``torch.export.save`` and applied from
    the file by rewrite's loader, gives the same logits and present cache in onnxruntime as
    the one converted in memory (which equals eager: the tests above)."""
    from rewrite._private.transformers_attention import grouped_query_attention
    from rewrite.exporting.checkpoint.cache import calling, causal_lm_call

    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    model = _eager(folder)
    layout = cache_layout(model)
    call = causal_lm_call(model, layout)
    with calling(model, call), grouped_query_attention():
        program = torch.export.export(model, call.args, dynamic_shapes=call.dynamic_shapes,
                                      strict=False)
    pt2 = tmp_path / "decode.pt2"
    torch.export.save(program, pt2)
    sessions = [ort.InferenceSession(_serialized(rewrite.apply("llama", source)),
                                     providers=["CPUExecutionProvider"])
                for source in (program, str(pt2))]
    layers, kv_heads, head_dim = len(layout), layout[0].key_heads, layout[0].key_dim
    generator = torch.Generator().manual_seed(5)
    past = [(torch.randn(3, kv_heads, 4, head_dim, generator=generator).numpy(),
             torch.randn(3, kv_heads, 4, head_dim, generator=generator).numpy())] * layers
    ids = torch.randint(0, model.config.vocab_size, (3, 2), generator=generator)
    mask = torch.ones(3, 6, dtype=torch.long)
    positions = torch.arange(4, 6).repeat(3, 1)
    values = list(_feed(ids, mask, positions, past).values())
    memory, from_file = (s.run(None, dict(zip([i.name for i in s.get_inputs()], values)))
                         for s in sessions)
    assert len(memory) == len(from_file) == 1 + 2 * layers
    for got, want in zip(from_file, memory):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def _serialized(result) -> bytes:
    return ir.serde.serialize_model(result.to_onnx()).SerializeToString()
