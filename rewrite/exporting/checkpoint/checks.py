"""What a checkpoint's exported model must reproduce before it is published
(:class:`rewrite.exporting.verify.Check`), computed from the eager model on a few tokens.

A causal LM is called as users call it: its own ``forward`` with ``input_ids``,
``attention_mask`` and a cache, positions left to the model (so a family whose positions are
not ``0, 1, ...``, such as RoBERTa's after the padding index, is caught), then one greedy
decode step; the ONNX model is fed the documented inputs (``position_ids`` from the mask,
its own ``present`` cache fed back). An encoder or encoder-decoder is checked on its
example call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewrite.exporting.checkpoint.cache import Call, LayerCache, cache_keyword, model_cache
from rewrite.exporting.verify import Check, Step, as_numpy, tolerances

if TYPE_CHECKING:
    import torch

PROMPT = 5


def causal_lm_check(model: "torch.nn.Module", layout: tuple[LayerCache, ...] | None
                    ) -> Check | None:
    """A prefill of :data:`PROMPT` tokens, then (with a cache: ``layout``) one decode step;
    None for a bfloat16 model (numpy, which onnxruntime is fed from, has no bfloat16)."""
    import torch

    if model.dtype == torch.bfloat16:
        return None
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    cache = model_cache(model) if layout is not None else None
    logits, prefill_cache = _own_call(model, ids, PROMPT, cache)
    feeds = _feeds(ids, PROMPT)
    expected = {"logits": logits}
    if layout is None:
        steps = (Step(feeds, expected, name="prefill"),)
        return Check(steps, *tolerances(model.dtype), what=f"prefill of {PROMPT} tokens")
    for n, layer in enumerate(layout):
        key, value = layer.empty(1, 0, model.dtype)
        feeds[f"past_key_values.{n}.key"] = as_numpy(key)
        feeds[f"past_key_values.{n}.value"] = as_numpy(value)
    expected.update(_presents(prefill_cache, PROMPT))
    token = torch.from_numpy(logits[:, -1:]).argmax(-1)
    logits_next, decode_cache = _own_call(model, token, PROMPT + 1, cache)
    carried = {f"past_key_values.{n}.{kv}": f"present.{n}.{kv}"
               for n in range(len(layout)) for kv in ("key", "value")}
    steps = (Step(feeds, expected, name="prefill"),
             Step(_feeds(token, PROMPT + 1), {"logits": logits_next,
                                              **_presents(decode_cache, PROMPT + 1)},
                  carried, name="decode step"))
    return Check(steps, *tolerances(model.dtype),
                 what=f"prefill of {PROMPT} tokens and one decode step")


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


def _own_call(model: "torch.nn.Module", ids: "torch.Tensor", total: int, cache: Any
              ) -> tuple[Any, Any]:
    """The class's forward as a user calls it (no positions given); (logits, cache)."""
    import torch

    keywords: dict[str, Any] = {"input_ids": ids,
                                "attention_mask": torch.ones(1, total, dtype=torch.long)}
    if cache is not None:
        keywords.update(use_cache=True, **{cache_keyword(model): cache})
    else:
        keywords["use_cache"] = False
    with torch.no_grad():
        out = type(model).forward(model, **keywords)
    return as_numpy(out.logits), _snapshot(cache)


def _snapshot(cache: Any) -> list[tuple[Any, Any]] | None:
    """Copies of the cache's keys and values now (the next call appends to them)."""
    if cache is None:
        return None
    return [(as_numpy(layer.keys), as_numpy(layer.values)) for layer in cache.layers]


def _presents(cache: list | None, total: int) -> dict[str, Any]:
    """The expected ``present`` outputs: every layer whose eager cache holds all ``total``
    positions (a sliding-window layer's keeps only its window; its logits are still
    compared)."""
    presents: dict[str, Any] = {}
    for n, (key, value) in enumerate(cache or ()):
        if key.shape[2] == total and value.shape[2] == total:
            presents[f"present.{n}.key"], presents[f"present.{n}.value"] = key, value
    return presents


def _feeds(ids: "torch.Tensor", total: int) -> dict[str, Any]:
    """``input_ids``, ``attention_mask`` (all ones) and ``position_ids`` from the mask, as
    documented."""
    import numpy as np

    length = ids.shape[1]
    return {"input_ids": ids.numpy().astype(np.int64),
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(total - length, total, dtype=np.int64)[None]}
