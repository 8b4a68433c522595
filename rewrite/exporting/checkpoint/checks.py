"""What a checkpoint's exported model must reproduce before it is published
(:class:`rewrite.exporting.verify.Check`), computed from the eager model on a few tokens.

A causal LM is called as users call it: its own ``forward`` with ``input_ids``,
``attention_mask`` and a cache, positions left to the model (so a family whose positions are
not ``0, 1, ...`` and whose offset the graph does not add, as it adds RoBERTa's:
:func:`~rewrite.exporting.checkpoint.cache.position_offset`, is caught), then one greedy
decode step; the ONNX model is fed the documented inputs (``position_ids`` from the mask,
its own ``present`` cache fed back). An encoder or encoder-decoder is checked on its
example call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from rewrite.exporting.checkpoint.cache import (
    Call,
    LayerCache,
    cache_keyword,
    layer_state,
    model_cache,
    model_call,
    new_tokens_mask,
    own_forward,
)
from rewrite.exporting.verify import Check, Step, as_numpy, tolerances

if TYPE_CHECKING:
    import torch

PROMPT = 5


def causal_lm_check(model: "torch.nn.Module", layout: tuple[LayerCache, ...] | None,
                    decode: bool = True, one_pass: bool = False) -> Check | None:
    """A prefill of :data:`PROMPT` tokens, then (with a cache: ``layout``; ``decode``) one
    decode step; None for a bfloat16 model (numpy, which onnxruntime is fed from, has no
    bfloat16). ``one_pass``: both from one eager call where every layer keeps keys and
    values only (:func:`_one_pass_check`)."""
    import torch

    if model.dtype == torch.bfloat16:
        return None
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    if one_pass and decode and layout and all(
            layer.kv and not (layer.conv or layer.recurrent or layer.indexer or layer.named)
            for layer in layout):
        return _one_pass_check(model, layout, ids, vocab)
    cache = model_cache(model) if layout is not None else None
    # Bamba's family numbers a call's positions from 0 when given none, each decode step
    # too (transformers 5.24): given the documented ones, as onnxruntime is
    positions = any(layer.recurrent for layer in layout or ())
    new_only = new_tokens_mask(layout or ())
    logits, prefill_cache = _own_call(model, ids, PROMPT, cache, positions, new_only)
    feeds = _feeds(ids, PROMPT)
    expected = {"logits": logits}
    if layout is None:
        steps = (Step(feeds, expected, name="prefill"),)
        return Check(steps, *tolerances(model.dtype), what=f"prefill of {PROMPT} tokens")
    for n, layer in enumerate(layout):
        feeds.update(zip(layer.names(n), map(as_numpy, layer.past(1, 0, model.dtype))))
    expected.update(_presents(prefill_cache, PROMPT, layout))
    if not decode:
        return Check((Step(feeds, expected, name="prefill"),), *tolerances(model.dtype),
                     what=f"prefill of {PROMPT} tokens")
    token = torch.from_numpy(logits[:, -1:]).argmax(-1)
    logits_next, decode_cache = _own_call(model, token, PROMPT + 1, cache, positions,
                                          new_only)
    carried = {past: present for n, layer in enumerate(layout)
               for past, present in zip(layer.names(n), layer.names(n, present=True))}
    steps = (Step(feeds, expected, name="prefill"),
             Step(_feeds(token, PROMPT + 1), {"logits": logits_next,
                                              **_presents(decode_cache, PROMPT + 1, layout)},
                  carried, name="decode step"))
    return Check(steps, *tolerances(model.dtype),
                 what=f"prefill of {PROMPT} tokens and one decode step")


def _one_pass_check(model: "torch.nn.Module", layout: tuple[LayerCache, ...],
                    ids: "torch.Tensor", vocab: int) -> Check:
    """:func:`causal_lm_check`'s prefill and decode step from one eager call of
    :data:`PROMPT` + 1 tokens: a causal model's first :data:`PROMPT` rows and cache positions
    are its prefill's (the decode step's token is drawn, not the prefill's greedy choice).
    One eager pass over the weights instead of two: an int4 reference dequantizes each."""
    import torch

    token = torch.randint(0, vocab, (1, 1), generator=torch.Generator().manual_seed(1))
    logits, cache = _own_call(model, torch.cat([ids, token], 1), PROMPT + 1,
                              model_cache(model))
    whole = _presents(cache, PROMPT + 1, layout)
    feeds = _feeds(ids, PROMPT)
    for n, layer in enumerate(layout):
        feeds.update(zip(layer.names(n), map(as_numpy, layer.past(1, 0, model.dtype))))
    carried = {past: present for n, layer in enumerate(layout)
               for past, present in zip(layer.names(n), layer.names(n, present=True))}
    prefill = {"logits": logits[:, :PROMPT],
               **{name: value[:, :, :PROMPT] for name, value in whole.items()}}
    steps = (Step(feeds, prefill, name="prefill"),
             Step(_feeds(token, PROMPT + 1), {"logits": logits[:, PROMPT:], **whole},
                  carried, name="decode step"))
    return Check(steps, *tolerances(model.dtype),
                 what=f"prefill of {PROMPT} tokens and one decode step, from one eager call")


def fixed_cache_check(model: "torch.nn.Module", layout: tuple[LayerCache, ...],
                      context: int, static: Mapping[str, int], decode: bool = True
                      ) -> Check | None:
    """The fixed cache's prefill of :data:`PROMPT` tokens (or what the context holds) and
    (``decode``) one decode step, against the model's own call: the logits (the buffers'
    other slots are zeros, not the eager cache's). With ``static`` shapes: one chunk of
    exactly ``seq`` tokens in ``batch`` equal rows."""
    import torch

    if model.dtype == torch.bfloat16:
        return None
    batch = static.get("batch", 1)
    prompt = static.get("seq", min(PROMPT, context - 1))
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(0))
    cache = model_cache(model)
    logits, _ = _own_call(model, ids, prompt, cache)
    runs = [(ids, prompt, logits)]
    if "seq" not in static and decode:
        token = torch.from_numpy(logits[:, -1:]).argmax(-1)
        runs.append((token, prompt + 1, _own_call(model, token, prompt + 1, cache)[0]))
    steps = [_fixed_step(n, tokens, total, expected, layout, context, batch, model.dtype)
             for n, (tokens, total, expected) in enumerate(runs)]
    what = f"prefill of {prompt} tokens into a cache of {context}" + (
        " and one decode step" if len(steps) > 1 else "")
    return Check(tuple(steps), *tolerances(model.dtype), what=what)


def _fixed_step(n: int, tokens: "torch.Tensor", total: int, expected: Any,
                layout: tuple[LayerCache, ...], context: int, batch: int,
                dtype: "torch.dtype") -> Step:
    """Step ``n`` of :func:`fixed_cache_check`: the first feeds empty buffers, the next its
    ``present`` outputs."""
    import numpy as np

    feeds = {k: np.repeat(v, batch, axis=0) for k, v in _feeds(tokens, total).items()}
    feeds["attention_mask"] = np.repeat((np.arange(context) < total).astype(np.int64)[None],
                                        batch, axis=0)
    carried = {}
    for k, layer in enumerate(layout):
        if n == 0:
            key, value = layer.empty(batch, context, dtype)
            feeds[f"past_key_values.{k}.key"] = as_numpy(key)
            feeds[f"past_key_values.{k}.value"] = as_numpy(value)
        else:
            carried.update({f"past_key_values.{k}.{kv}": f"present.{k}.{kv}"
                            for kv in ("key", "value")})
    return Step(feeds, {"logits": np.repeat(expected, batch, axis=0)}, carried,
                name=("prefill", "decode step")[n])


def encoder_check(model: "torch.nn.Module", call: Call) -> Check | None:
    """The example call of an encoder or encoder-decoder, its tensors compared by name."""
    import torch

    if model.dtype == torch.bfloat16:
        return None
    with torch.no_grad():
        outputs = call.forward(model, *call.args)
    feeds = {name: as_numpy(arg) for name, arg in zip(call.input_names, call.args)}
    expected = {name: as_numpy(out) for name, out in zip(call.output_names, outputs)}
    return Check((Step(feeds, expected, name="prefill"),), *tolerances(model.dtype),
                 what="the example inputs")


def _own_call(model: "torch.nn.Module", ids: "torch.Tensor", total: int, cache: Any,
              positions: bool = False, new_only: bool = False) -> tuple[Any, Any]:
    """The eager reference: the model's own call (:func:`own_forward`, ``positions`` given
    or not, the mask of every token or ``new_only``); (logits, cache)."""
    step = "a decode step" if cache is not None and total > ids.shape[1] else "a prefill"
    out = own_forward(model, ids, total, cache,
                      f"{step} of {ids.shape[1]} token(s), the eager reference the written "
                      "model is checked against", positions, new_only)
    return as_numpy(out.logits), _snapshot(cache)


def _snapshot(cache: Any) -> list[tuple[Any, ...]] | None:
    """Copies of each cache layer's state now (the next call changes it): keys and values,
    a convolution state (:func:`layer_state`)."""
    if cache is None:
        return None
    return [tuple(None if state is None else as_numpy(state) for state in layer_state(layer))
            for layer in cache.layers]


def _presents(cache: list | None, total: int, layout: tuple[LayerCache, ...]
              ) -> dict[str, Any]:
    """The expected ``present`` outputs (named by ``layout``): every convolution state, and
    the keys and values of every layer whose eager cache holds all ``total`` positions (a
    sliding-window layer's keeps only its window; its logits are still compared), and every
    state the eager cache holds in the graph's form (not None)."""
    presents: dict[str, Any] = {}
    for n, (layer, state) in enumerate(zip(layout, cache or ())):
        named = {name: value for name, value in zip(layer.names(n, present=True), state)
                 if value is not None}
        if layer.kv and any(named[f"present.{n}.{kv}"].shape[2] != total
                            for kv in ("key", "value")):
            del named[f"present.{n}.key"], named[f"present.{n}.value"]
        presents.update(named)
    return presents


def _feeds(ids: "torch.Tensor", total: int) -> dict[str, Any]:
    """``input_ids``, ``attention_mask`` (all ones) and ``position_ids`` from the mask, as
    documented."""
    import numpy as np

    length = ids.shape[1]
    return {"input_ids": ids.numpy().astype(np.int64),
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(total - length, total, dtype=np.int64)[None]}


def seq2seq_checks(model: "torch.nn.Module", layout: tuple[tuple[LayerCache, ...], ...]
                   ) -> tuple[Check | None, Check | None]:
    """The encoder on :data:`PROMPT` tokens, then the decoder's first step (both pasts
    empty) and one greedy step (its ``present`` outputs fed back), against the model's own
    calls: (encoder's check, decoder's); None for a bfloat16 model."""
    import torch
    from transformers import EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    from rewrite.exporting.checkpoint.seq2seq import start

    if model.dtype == torch.bfloat16:
        return None, None
    inputs = start(model, PROMPT)
    token = inputs.pop("decoder_input_ids")
    states = model_call(model.get_encoder(), {**inputs, "return_dict": True},
                        "the encoder, the eager reference").last_hidden_state
    encoded = {name: as_numpy(value) for name, value in inputs.items()}
    mask = {k: v for k, v in inputs.items() if k == "attention_mask"}  # Whisper: none
    encoder_check = Check((Step(encoded, {"encoder_hidden_states": as_numpy(states)},
                                name="encoder"),), *tolerances(model.dtype),
                          what="the encoder on " + ("random frames" if not mask
                                                    else f"{PROMPT} tokens"))
    cache = EncoderDecoderCache(model_cache(model), model_cache(model))
    fixed = {"encoder_hidden_states": as_numpy(states),
             **{"encoder_attention_mask": as_numpy(v) for v in mask.values()}}
    steps = []
    for n in range(2):
        out = model_call(model, {**mask, "decoder_input_ids": token, "use_cache": True,
                                 "encoder_outputs": BaseModelOutput(last_hidden_state=states),
                                 cache_keyword(model): cache},
                         f"decoder step {n + 1}, the eager reference")
        feeds = {"input_ids": as_numpy(token), **fixed}
        carried = {}
        for k, (mine, cross) in enumerate(zip(*layout)):
            for which, layer in (("decoder", mine), ("encoder", cross)):
                names = [f"past_key_values.{k}.{which}.{kv}" for kv in ("key", "value")]
                if n == 0:
                    feeds.update(zip(names, map(as_numpy, layer.empty(1, 0, model.dtype))))
                else:
                    carried.update({name: name.replace("past_key_values", "present")
                                    for name in names})
        expected = {"logits": as_numpy(out.logits), **_both_presents(cache)}
        steps.append(Step(feeds, expected, carried, name=("first step", "decode step")[n]))
        token = out.logits[:, -1:].argmax(-1)
    return encoder_check, Check(tuple(steps), *tolerances(model.dtype),
                                what="the first decoder step and one decode step")


def _both_presents(cache: Any) -> dict[str, Any]:
    """The expected ``present.N.decoder`` / ``.encoder`` outputs: the eager cache now."""
    presents = {}
    for which, part in (("decoder", cache.self_attention_cache),
                        ("encoder", cache.cross_attention_cache)):
        for n, layer in enumerate(part.layers):
            presents[f"present.{n}.{which}.key"] = as_numpy(layer.keys)
            presents[f"present.{n}.{which}.value"] = as_numpy(layer.values)
    return presents
