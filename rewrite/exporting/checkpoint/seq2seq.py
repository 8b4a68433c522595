"""What ``torch.export`` is given for a decode-ready encoder-decoder (``--cache kv`` on BART,
T5, Whisper and the ``*ForConditionalGeneration`` models built as they are): two calls of
the one model, each exported to its own graph, the names optimum uses::

    encoder_model.onnx
      inputs   input_ids, attention_mask [batch_size, encoder_sequence_length]
               (Whisper: input_features [batch_size, mel bins, frames], only the batch
               dynamic: its positions fit one length)
      outputs  encoder_hidden_states [batch_size, encoder_sequence_length, hidden]
    decoder_model.onnx
      inputs   input_ids [batch_size, decoder_sequence_length],
               encoder_hidden_states [batch_size, encoder_sequence_length, hidden],
               encoder_attention_mask [batch_size, encoder_sequence_length] (not Whisper's:
                   its decoder attends to every frame),
               past_key_values.N.decoder.key / .value
                   [batch_size, heads, past_decoder_sequence_length, head_dim]
               past_key_values.N.encoder.key / .value
                   [batch_size, heads, past_encoder_sequence_length, head_dim]
      outputs  logits [batch_size, decoder_sequence_length, vocab],
               present.N.decoder.key / .value (the past and the new tokens),
               present.N.encoder.key / .value [..., encoder_sequence_length, ...]

The first decoder step is fed both pasts with 0 positions: each layer projects the encoder's
states to its cross-attention keys and values and returns them as ``present.N.encoder``;
later steps feed them back (and the same ``encoder_hidden_states``), and the layer does not
project them again. How one graph does both: a layer's cross cache is extended with the
encoder positions it does not hold yet, ``encoder_hidden_states[:, min(P, E - 1):]`` (``P``
the past's positions, ``E`` the encoder's), and keeps its first ``E`` positions. With ``P =
0`` that is all of them; with ``P = E`` one position is projected and dropped (ONNX cannot
reshape an empty projection). The decoder's positions come from its past's length.

The calls are the model's own: its ``forward`` is replaced on the instance while exporting
(:func:`rewrite.exporting.checkpoint.cache.calling`; module paths and weight names stay the
checkpoint's), the encoder is the model's ``get_encoder()``, the decoder step the class's
forward with ``encoder_outputs`` and an ``EncoderDecoderCache`` made of the given tensors.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from rewrite.exporting.checkpoint.cache import (
    EXAMPLE_BATCH,
    Call,
    LayerCache,
    cache_keyword,
    layers_of,
    model_cache,
    model_call,
)
from rewrite.errors import InputError

if TYPE_CHECKING:
    import torch

ENCODER, DECODER = "encoder_model.onnx", "decoder_model.onnx"
EXAMPLE_ENCODER, EXAMPLE_DECODER, EXAMPLE_PAST, EXAMPLE_CROSS = 5, 3, 4, 2
CROSS = "key_value_states"
"""The keyword by which a decoder layer gives its cross-attention the encoder's states."""


def is_encoder_decoder(config: dict) -> bool:
    """Whether a checkpoint's ``config.json`` describes an encoder-decoder."""
    return bool(config.get("is_encoder_decoder"))


def graphs(output: "str | Path") -> tuple[Path, Path]:
    """Where the encoder's and the decoder's graphs go for ``-o output``: its folder."""
    folder = Path(output).parent
    return folder / ENCODER, folder / DECODER


def seq2seq_layout(model: "torch.nn.Module"
                   ) -> tuple[tuple[LayerCache, ...], tuple[LayerCache, ...]]:
    """The shapes of the decoder's self-attention and cross-attention caches, per layer, as
    the model returns them for one step (:func:`layers_of`)."""
    from transformers import EncoderDecoderCache

    cache = EncoderDecoderCache(model_cache(model), model_cache(model))
    model_call(model, {**start(model, 2), "use_cache": True, cache_keyword(model): cache},
               "one decoder step with a cache")
    name = type(model).__name__
    mine = layers_of(name, cache.self_attention_cache)
    cross = layers_of(name, cache.cross_attention_cache)
    if len(mine) != len(cross):
        raise InputError(f"{name}: {len(mine)} self-attention caches but {len(cross)} "
                         "cross-attention caches: --cache kv needs one of each per layer")
    return mine, cross


def audio(model: "torch.nn.Module") -> bool:
    """Whether the model's encoder takes ``input_features`` (Whisper's log-mel frames, of the
    one length its positions fit) rather than tokens."""
    return getattr(model, "main_input_name", "input_ids") == "input_features"


def encoder_inputs(model: "torch.nn.Module", batch: int, length: int,
                   seed: int | None = None) -> dict[str, "torch.Tensor"]:
    """The encoder's inputs: ``length`` random tokens and their mask (all ones), or
    Whisper's frames (``2 * max_source_positions`` of them); ``seed``: a fixed draw."""
    import torch

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    config = model.config
    if audio(model):
        shape = (batch, config.num_mel_bins, 2 * config.max_source_positions)
        return {"input_features": torch.randn(*shape, generator=generator, dtype=model.dtype)}
    vocab = config.get_text_config().vocab_size
    return {"input_ids": torch.randint(0, vocab, (batch, length), generator=generator),
            "attention_mask": torch.ones(batch, length, dtype=torch.long)}


def start(model: "torch.nn.Module", length: int) -> dict[str, "torch.Tensor"]:
    """Encoder inputs (:func:`encoder_inputs`, a fixed draw) and the decoder's start token
    (the generation config's, else the config's, else 0), a batch of one."""
    import torch

    configs = (getattr(model, "generation_config", None), model.config)
    first = next((c.decoder_start_token_id for c in configs
                  if isinstance(getattr(c, "decoder_start_token_id", None), int)), 0)
    return {**encoder_inputs(model, 1, length, seed=0),
            "decoder_input_ids": torch.full((1, 1), first, dtype=torch.long)}


def encoder_call(model: "torch.nn.Module") -> Call:
    """Example inputs, dynamic shapes and I/O names of the encoder graph (Whisper's frames:
    only the batch is dynamic)."""
    from torch.export import Dim

    from rewrite.exporting.checkpoint.encoders import sequence_bound

    inputs = encoder_inputs(model, EXAMPLE_BATCH, EXAMPLE_ENCODER)
    batch = Dim("batch_size")
    sequence = Dim("encoder_sequence_length", **sequence_bound(model.config))
    named = {0: "batch_size"} if audio(model) else {0: "batch_size",
                                                    1: "encoder_sequence_length"}
    shapes = tuple({0: batch, 1: sequence} if len(named) == 2 else {0: batch}
                   for _ in inputs)
    return Call(tuple(inputs.values()), shapes, tuple(inputs), ("encoder_hidden_states",),
                tuple(named for _ in inputs),
                audio_encoder_forward if audio(model) else encoder_forward)


def encoder_forward(self: "torch.nn.Module", input_ids: "torch.Tensor",
                    attention_mask: "torch.Tensor") -> tuple:
    """The model's encoder on the tokens: ``(encoder_hidden_states,)``."""
    out = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                             return_dict=True)
    return (out.last_hidden_state,)


def audio_encoder_forward(self: "torch.nn.Module", input_features: "torch.Tensor") -> tuple:
    """The model's encoder on Whisper's frames: ``(encoder_hidden_states,)``."""
    out = self.get_encoder()(input_features=input_features, return_dict=True)
    return (out.last_hidden_state,)


def decoder_call(model: "torch.nn.Module", layout: tuple[tuple[LayerCache, ...],
                                                         tuple[LayerCache, ...]]) -> Call:
    """Example inputs, dynamic shapes and I/O names of the decoder step (``layout``:
    :func:`seq2seq_layout`)."""
    import torch
    from torch.export import Dim

    config = model.config
    vocab = config.get_text_config(decoder=True).vocab_size
    hidden = config.get_text_config().hidden_size
    b, s, e = EXAMPLE_BATCH, EXAMPLE_DECODER, EXAMPLE_ENCODER
    dims = {name: Dim(name) for name in ("batch_size", "decoder_sequence_length",
                                         "encoder_sequence_length",
                                         "past_decoder_sequence_length",
                                         "past_encoder_sequence_length")}
    pasts = {"decoder": "past_decoder_sequence_length",
             "encoder": "past_encoder_sequence_length"}
    names: list = [{0: "batch_size", 1: "decoder_sequence_length"},
                   {0: "batch_size", 1: "encoder_sequence_length"},
                   [tuple({0: "batch_size", 2: pasts[w]} for w in pasts for _ in "kv")
                    for _ in layout[0]],
                   {0: "batch_size", 1: "encoder_sequence_length"}]
    past = [(*mine.empty(b, EXAMPLE_PAST, model.dtype), *cross.empty(b, EXAMPLE_CROSS,
                                                                      model.dtype))
            for mine, cross in zip(*layout)]
    args = [torch.randint(0, vocab, (b, s)), torch.randn(b, e, hidden, dtype=model.dtype),
            past, torch.ones(b, e, dtype=torch.long)]
    entries = [f"{n}.{w}.{kv}" for n in range(len(layout[0])) for w in pasts
               for kv in ("key", "value")]
    inputs = ["input_ids", "encoder_hidden_states",
              *(f"past_key_values.{entry}" for entry in entries), "encoder_attention_mask"]
    if audio(model):  # Whisper's decoder attends to every frame: no mask
        del args[-1], names[-1], inputs[-1]
    shapes = _as_dims(names, dims)
    outputs = ("logits", *(f"present.{entry}" for entry in entries))
    return Call(tuple(args), tuple(shapes), tuple(inputs), outputs, tuple(names),
                decoder_forward)


def _as_dims(names: Any, dims: dict) -> Any:
    """``names`` (axis -> dimension name, nested in lists and tuples) with ``Dim``\\ s."""
    if isinstance(names, dict):
        return {axis: dims[name] for axis, name in names.items()}
    return type(names)(_as_dims(n, dims) for n in names)


def decoder_forward(self: "torch.nn.Module", input_ids: "torch.Tensor",
                    encoder_hidden_states: "torch.Tensor", past_key_values: list,
                    encoder_attention_mask: "torch.Tensor | None" = None) -> tuple:
    """One decoder step of the model with both caches as tensors: ``(logits, [(decoder key,
    decoder value, encoder key, encoder value), ...])``."""
    from transformers import DynamicCache, EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    mine = DynamicCache([(k, v) for k, v, _, _ in past_key_values])
    cross = DynamicCache([(k, v) for _, _, k, v in past_key_values])
    cache = EncoderDecoderCache(mine, DynamicCache())  # no cross layers: no guard on shapes
    cache.cross_attention_cache = cross
    cache.is_updated = dict.fromkeys(range(len(past_key_values)), False)
    with _extending(self, cross, encoder_hidden_states.shape[1]):
        mask = {} if encoder_attention_mask is None else {
            "attention_mask": encoder_attention_mask}
        out = type(self).forward(
            self, decoder_input_ids=input_ids, use_cache=True, **mask,
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_hidden_states),
            **{cache_keyword(self): cache})
    return out.logits, [(a.keys, a.values, c.keys, c.values)
                        for a, c in zip(mine.layers, cross.layers)]


@contextlib.contextmanager
def _extending(model: "torch.nn.Module", cross: Any, length: Any) -> Iterator[None]:
    """While the block runs, each cross-attention of ``model`` (a module taking
    :data:`CROSS`, with a ``layer_idx``) projects only the encoder positions its layer of
    ``cross`` does not hold (one at least), and that layer keeps its first ``length``
    positions of the past and the new (the module docstring)."""
    import torch

    reached: set[int] = set()
    sliced: list["torch.Tensor"] = []  # a module inside another that takes them: once

    def hook(module: "torch.nn.Module", args: tuple, kwargs: dict) -> Any:
        states = kwargs.get(CROSS)
        if states is None or any(states is done for done in sliced):
            return None
        layer = cross.layers[module.layer_idx]
        reached.add(module.layer_idx)
        sliced.append(states[:, torch.sym_min(layer.keys.shape[2], length - 1):])
        return args, {**kwargs, CROSS: sliced[-1]}

    modules = [m for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)
               and CROSS in inspect.signature(m.forward).parameters]
    taking = {m.layer_idx for m in modules} & set(range(len(cross.layers)))
    if len(taking) != len(cross.layers):
        raise InputError(f"{type(model).__name__}: {len(taking)} of {len(cross.layers)} "
                         f"decoder layers take their cross-attention {CROSS}: --cache kv "
                         "needs every one to (as BART's and T5's do)")
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    for layer in cross.layers:
        layer.update = _keeping(layer.update, length)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    if not reached:  # a layer whose call was recorded, not traced, runs no hook
        raise InputError(f"{type(model).__name__}: no decoder layer gives its cross-attention "
                         f"{CROSS}: --cache kv needs every one to (as BART's and T5's do)")


def _keeping(update: Any, length: Any) -> Any:
    """A cache layer's ``update`` that keeps the first ``length`` positions."""

    def kept(keys: "torch.Tensor", values: "torch.Tensor", *args: Any, **kwargs: Any
             ) -> tuple["torch.Tensor", "torch.Tensor"]:
        owner = update.__self__
        update(keys, values, *args, **kwargs)
        owner.keys, owner.values = owner.keys[:, :, :length], owner.values[:, :, :length]
        return owner.keys, owner.values

    return kept
