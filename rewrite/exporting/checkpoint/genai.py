"""The folder onnxruntime-genai runs as is: ``genai_config.json`` and the checkpoint's tokenizer
files, published beside the model, with it (:class:`rewrite.files.outputs.Beside`).

``genai_config.json`` is derived from the model's config (transformers' reading of
``config.json``: its text config for a multimodal one), ``generation_config.json`` and the
exported graph, with the field names of onnxruntime-genai's model builder:

- ``model.type``: the config's ``model_type`` where the runtime has a family of that name
  (:data:`RUNTIME_FAMILIES`), else the runtime's generic ``decoder``;
- ``model.decoder``: the file name, hidden size, attention heads; KV heads, head size and
  layers from the model's own cache (one shape for every layer's keys and values, else no
  config: multi-head latent attention, per-layer sizes);
  ``inputs`` / ``outputs``: the graph's names (``input_ids``, ``attention_mask``,
  ``position_ids``, ``past_key_values.%d.key`` ... ``logits``, ``present.%d.key`` ...); a
  hybrid whose other layers keep a convolution and a recurrent state (Bamba, Jamba,
  Qwen3-Next...) also ``past.%d.conv`` / ``past.%d.recurrent`` (``past_conv_names``,
  ``past_recurrent_names``: onnxruntime-genai 0.18 finds the layers that have them among the
  graph's inputs), the KV heads and head size its attention layers';
- ``model.context_length`` (``seq_length``, else ``max_position_embeddings``, less the
  positions the model numbers its tokens after: RoBERTa's ``padding_idx + 1``), ``vocab_size``,
  ``bos`` / ``eos`` / ``pad_token_id`` (the generation config's, else the config's; the
  tokenizer's ``eos_token`` is added to the end ids as the builder does; no pad id: the first
  end id; ids outside the vocabulary, which the runtime refuses, are left out);
- ``search``: the generation config's defaults (``do_sample``, ``temperature``, ``top_k``,
  ``top_p``, ``num_beams``, ``repetition_penalty``...), ``max_length`` the context length, and
  ``past_present_share_buffer`` only where the graph allows it: every ``present`` as long as
  its ``past`` (a cache written in place). The ``kv`` graph grows the cache by ``Concat``, so
  it is ``false``. A model exported for bounded lengths (:mod:`rewrite.exporting.bounds`) has
  a context length (and ``max_length``) of at most the smallest bound.

The tokenizer files present in the checkpoint (:data:`TOKENIZER_FILES`) are copied byte for
byte, whatever the model.

Pass-through (documented, not an error): where no ``genai_config.json`` can be derived (an
encoder or encoder-decoder, a causal LM exported without its KV cache or with a fixed one
(``--cache static``: the runtime on CPU feeds an attention mask as long as the tokens so far,
where the graph takes one per slot of the buffer), a config without a context length or end
id, caches of several shapes) the model is written without one, and one note line says why;
a ``genai_config.json`` of an earlier run that names the output is removed with the old
model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from rewrite.exporting.checkpoint.cache import Call, LayerCache
from rewrite.exporting.checkpoint.folder import Checkpoint
from rewrite.exporting.bounds import recorded
from rewrite.files.outputs import Beside, Companion

if TYPE_CHECKING:
    import onnx_ir as ir

GENAI_CONFIG = "genai_config.json"
GENERATION_CONFIG = "generation_config.json"
GENERIC = "decoder"
RUNTIME_FAMILIES = frozenset(
    "chatglm ernie4_5 gemma gemma2 gemma3_text gptoss granite internlm2 llama mistral "
    "nemotron olmo phi phimoe phi3 phi3small qwen2 qwen3 smollm3".split())
"""The language-model families of onnxruntime-genai 0.18 (``src/models/model_type.h``) that
it runs as plain decoders with one key and one value cache per layer; any other
``model_type`` is the generic ``decoder``. Not ``gpt2``: the runtime's GPT-2 takes the
builder's one combined ``past_%d`` per layer; nor the hybrid families (``lfm2``...): a
hybrid whose layers keep keys and values or a convolution and a recurrent state is the generic
``decoder``, its states named by ``past_conv_names`` / ``past_recurrent_names``."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")
"""What transformers' tokenizers read from a checkpoint, copied when present."""
SEARCH = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True,
          "length_penalty": 1.0, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
          "num_return_sequences": 1, "repetition_penalty": 1.0, "temperature": 1.0,
          "top_k": 50, "top_p": 1.0}
"""The search options and their defaults (transformers'); the generation config overrides."""


@frozen
class Genai:
    """What is published beside a checkpoint's model, known before exporting it."""

    config: dict | None
    """``genai_config.json`` but for what the graph decides (:func:`beside`); None: none."""
    reason: str
    """Why there is no ``config`` (empty when there is one)."""
    tokenizer: tuple[Path, ...]
    """The checkpoint's tokenizer files."""

    def note(self, output: Path) -> str:
        """One line for the user: what is written beside ``output``, or why not."""
        names = ", ".join(p.name for p in self.tokenizer) or "no tokenizer files"
        if self.config is None:
            return (f"{GENAI_CONFIG}: not written beside {output.name} ({self.reason}); "
                    f"copied {names}")
        return (f"wrote {GENAI_CONFIG} (type {self.config['model']['type']!r}) and {names} "
                f"beside {output.name}: onnxruntime-genai runs its folder as is")


def plan(checkpoint: Checkpoint, model_config: Any, call: Call | None,
         layout: tuple[LayerCache, ...] | None, cache: str = "kv") -> Genai:
    """What to publish beside the model of ``checkpoint`` exported as ``call`` (None: not a
    causal LM) with the cache ``layout`` (the model's own; None: no cache) of kind
    ``cache`` (``kv``, ``static``...)."""
    tokenizer = tuple(checkpoint.path / name for name in TOKENIZER_FILES
                      if (checkpoint.path / name).is_file())
    if call is None:
        return Genai(None, "not a causal LM: onnxruntime-genai runs decoders", tokenizer)
    if layout is None:
        return Genai(None, "no KV cache (--cache none): onnxruntime-genai feeds it back",
                     tokenizer)
    if cache != "kv":
        return Genai(None, f"a fixed cache (--cache {cache}): onnxruntime-genai feeds an "
                     "attention mask as long as the tokens so far, the graph takes one per "
                     "slot", tokenizer)
    try:
        config = _config(checkpoint, model_config, call, layout, tokenizer)
    except _NotDerived as e:
        return Genai(None, str(e), tokenizer)
    return Genai(config, "", tokenizer)


def beside(genai: Genai, output: Path, model: "ir.Model") -> Beside:
    """The files to publish with ``model`` at ``output``: ``genai_config.json`` completed
    from the graph, the tokenizer files (but one that already is the file beside
    ``output``: the checkpoint's own folder)."""
    folder = output.parent
    files = [Companion(p.name, source=p) for p in genai.tokenizer
             if not _same_file(p, folder / p.name)]
    if genai.config is None:
        return Beside(tuple(files), _stale_config(output))
    config = json.loads(json.dumps(genai.config))
    config["model"]["decoder"]["filename"] = output.name
    config["search"]["past_present_share_buffer"] = shares_buffer(model)
    within = min(recorded(model).values(), default=None)
    if within is not None and within < config["model"]["context_length"]:
        config["model"]["context_length"] = config["search"]["max_length"] = within
    text = json.dumps(config, indent=4) + "\n"
    return Beside((Companion(GENAI_CONFIG, text=text), *files))


def shares_buffer(model: "ir.Model") -> bool:
    """Whether every ``present.N.*`` output has the shape of its ``past_key_values.N.*``
    input (the cache is written in place, so past and present may be one buffer)."""
    pasts = {v.name: v for v in model.graph.inputs if v.name}
    pairs = [(pasts.get(v.name.replace("present.", "past_key_values.", 1)), v)
             for v in model.graph.outputs if v.name and v.name.startswith("present.")]
    return bool(pairs) and all(
        past is not None and past.shape is not None and present.shape is not None
        and list(past.shape) == list(present.shape) for past, present in pairs)


class _NotDerived(Exception):
    """A field of ``genai_config.json`` the checkpoint does not give (the message says which)."""


def _config(checkpoint: Checkpoint, model_config: Any, call: Call,
            layout: tuple[LayerCache, ...], tokenizer: tuple[Path, ...]) -> dict:
    """``genai_config.json`` but ``filename`` and ``past_present_share_buffer``."""
    text = model_config.get_text_config(decoder=True)
    kv_heads, head_dim = _one_shape(layout)
    context = getattr(text, "seq_length", None) or getattr(text, "max_position_embeddings", None)
    if not isinstance(context, int):
        raise _NotDerived("its config gives no context length (max_position_embeddings)")
    context -= call.position_offset  # RoBERTa's first positions are not the tokens'
    generation = _json(checkpoint.path / GENERATION_CONFIG)
    ids = _token_ids(generation, (model_config, text), tokenizer, text.vocab_size)
    model_type = checkpoint.model_type
    return {
        "model": {
            **ids,
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "",
                "head_size": head_dim,
                "hidden_size": text.hidden_size,
                "inputs": _names(call.input_names, "past_key_values", "past"),
                "outputs": _names(call.output_names, "present", "present"),
                "num_attention_heads": text.num_attention_heads,
                "num_hidden_layers": len(layout),
                "num_key_value_heads": kv_heads,
            },
            "type": model_type if model_type in RUNTIME_FAMILIES else GENERIC,
            "vocab_size": text.vocab_size,
        },
        "search": {**_search(generation), "max_length": context,
                   "past_present_share_buffer": False},
    }


def _one_shape(layout: tuple[LayerCache, ...]) -> tuple[int, int]:
    """(KV heads, head size) of every attention layer's keys and values: the runtime takes
    one. The other layers may keep a convolution and a recurrent state instead (a hybrid's
    recurrent layers: the runtime's recurrent state, 0.18)."""
    if any(layer.indexer or layer.named or layer.more_convs or (layer.kv and layer.conv)
           for layer in layout) or not all(
            layer.kv or (layer.conv and layer.recurrent) for layer in layout):
        raise _NotDerived("not every layer's cache is keys and values alone, or a "
                          "convolution and a recurrent state alone (indexer keys, "
                          "compressor states, short-convolution layers, several convolution "
                          "states, layers "
                          "reading another's or keeping both); rewrite writes "
                          "genai_config.json for those two only")
    attending = [layer for layer in layout if layer.kv]
    if not attending:
        raise _NotDerived("no layer keeps keys and values")
    shapes = {(layer.key_heads, layer.key_dim) for layer in attending} | \
        {(layer.value_heads, layer.value_dim) for layer in attending}
    if len(shapes) != 1:
        raise _NotDerived("its layers' keys and values differ in heads or head size "
                          f"({', '.join(f'{h}x{d}' for h, d in sorted(shapes))}); "
                          "onnxruntime-genai takes one shape for every cache")
    return next(iter(shapes))


def _names(names: tuple[str, ...], cache: str, key: str) -> dict[str, str]:
    """The genai name map of the graph's inputs or outputs: plain names as themselves, the
    cache as ``{cache}.%d.key`` / ``.value``, a hybrid's states as ``{key}.%d.conv`` /
    ``.recurrent``."""
    import re

    def per_layer(prefix: str, kind: str) -> bool:
        return any(re.fullmatch(rf"{re.escape(prefix)}\.\d+\.{kind}", n) for n in names)

    mapped = {name: name for name in names
              if not name.startswith((f"{cache}.", f"{key}."))}
    for prefix, kind in ((cache, "key"), (cache, "value"), (key, "conv"), (key, "recurrent")):
        if per_layer(prefix, kind):
            mapped[f"{key}_{kind}_names"] = f"{prefix}.%d.{kind}"
    return mapped


def _token_ids(generation: dict, configs: tuple, tokenizer: tuple[Path, ...],
               vocab: int) -> dict:
    """``bos`` / ``eos`` / ``pad_token_id``: the generation config's, else the configs'; the
    tokenizer's end token added to the end ids; the first end id as pad id when none. Ids
    outside the vocabulary (which the model never produces; the runtime refuses them) are
    left out."""
    def given(name: str) -> Any:
        for value in (generation.get(name), *(getattr(c, name, None) for c in configs)):
            if value is not None:
                return value
        return None

    def known(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab

    bos, eos, pad = given("bos_token_id"), given("eos_token_id"), given("pad_token_id")
    ends = [e for e in (eos if isinstance(eos, list) else [eos]) if known(e)]
    turn_end = _tokenizer_eos(tokenizer)
    if known(turn_end) and turn_end not in ends:
        ends = [turn_end, *ends]
    if not ends:
        raise _NotDerived("neither its configs nor its tokenizer give an end token id "
                          f"(eos_token_id) under its vocabulary size {vocab}")
    ids: dict[str, Any] = {"bos_token_id": bos} if known(bos) else {}
    ids["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    ids["pad_token_id"] = pad if known(pad) else ends[0]
    return ids


def _tokenizer_eos(tokenizer: tuple[Path, ...]) -> int | None:
    """The id of ``tokenizer_config.json``'s ``eos_token`` in ``tokenizer.json``, if both
    say."""
    files = {p.name: p for p in tokenizer}
    if "tokenizer_config.json" not in files or "tokenizer.json" not in files:
        return None
    token = _json(files["tokenizer_config.json"]).get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    if not isinstance(token, str):
        return None
    vocabulary = _json(files["tokenizer.json"])
    for added in vocabulary.get("added_tokens") or ():
        if isinstance(added, dict) and added.get("content") == token:
            found = added.get("id")
            return found if isinstance(found, int) else None
    model = vocabulary.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    found = vocab.get(token) if isinstance(vocab, dict) else None
    return found if isinstance(found, int) else None


def _search(generation: dict) -> dict:
    """The search options: :data:`SEARCH`, overridden by the generation config's values of
    the same type (``early_stopping: "never"`` is not a genai option)."""
    search = dict(SEARCH)
    for name, default in SEARCH.items():
        value = generation.get(name)
        if isinstance(default, float) and isinstance(value, int) and \
                not isinstance(value, bool):
            value = float(value)
        if value is not None and type(value) is type(default):
            search[name] = value
    return search


def _json(file: Path) -> dict:
    """The JSON object in ``file``; empty when it is missing or unreadable (the generation
    config and tokenizer files are optional: what they do not say has a default)."""
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _stale_config(output: Path) -> tuple[str, ...]:
    """``genai_config.json`` beside ``output`` when it names ``output`` (an earlier run's,
    which would describe the model being replaced)."""
    model = _json(output.parent / GENAI_CONFIG).get("model")
    decoder = model.get("decoder") if isinstance(model, dict) else None
    named = isinstance(decoder, dict) and decoder.get("filename") == output.name
    return (GENAI_CONFIG,) if named else ()
