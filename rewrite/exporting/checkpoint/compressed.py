"""DeepSeek-V4's compressed attention with its compressor's state as tensors of fixed or
past-long shapes.

transformers' DeepSeek-V4 layers attend over a sliding window of keys (= values) and over
compressed entries, one per window of ``compress_rate`` tokens (4 for compressed sparse
attention, CSA, with a lightning indexer choosing the entries; 128 for heavily compressed
attention, HCA). Its cache (``DeepseekV4HCACache`` / ``DeepseekV4CSACache``) keeps the tokens
since the last full window (as many as the past length modulo the rate), the entries, the
previous window's half for CSA's overlapping windows, and Python-int counters: shapes that
depend on the past length modulo the rate, and branches on them, which torch.export cannot
follow for every length.

While the cache layout is read and while exporting, the compressors' and the indexer's
forwards are :func:`hca_forward`, :func:`csa_forward` and :func:`indexer_forward`: the same
numbers, their states in the layer of the cache (``named_states``) in shapes of the past
length or fixed, no branch on a length:

- ``kv`` / ``gate`` ``[batch, window - 1, width]``: the projections of the last ``window - 1``
  tokens (zeros before the first token), ``window`` the rate (HCA) or twice the rate (CSA:
  an entry weighs the previous window's first half with its own second half);
- ``compressed`` ``[batch, past_sequence_length, head_dim]``: one row per token, the entry of
  the window that token closes at a row whose index + 1 is a multiple of the rate, zeros
  elsewhere; the attention's mask hides the other rows.

Each new token computes the entry of the window ending at it (the rows before it from the
state), kept where the token closes a window: the window and its rotary position (its first
token's) come from the token's index in the cache, a tensor, not a Python int. The indexer
keeps the same three states for its own projections (``indexer.*``).
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

COMPRESSORS = {"DeepseekV4HCACompressor": ("compressor",),
               "DeepseekV4CSACompressor": ("compressor", "indexer")}
"""The compressor classes and the states' prefixes of their layers (a CSA layer's indexer
keeps its own)."""
STATES = ("kv", "gate", "compressed")
"""Each prefix's states, in the order the graph takes them."""


def state_names(model: "torch.nn.Module", n: int) -> tuple[str, ...]:
    """The names of layer ``n``'s compressor states (``compressor.kv``, ...), in the
    graph's order; none for a layer without a compressor."""
    for path, module in model.named_modules():
        prefixes = COMPRESSORS.get(type(module).__name__)
        if prefixes and int(re.findall(r"\d+", path)[-1]) == n:
            return tuple(f"{prefix}.{state}" for prefix in prefixes for state in STATES)
    return ()


def grows(name: str) -> bool:
    """Whether the state ``name`` has a row per token of the past (its axis 1)."""
    return name.endswith(".compressed")


def eager_states(layer: Any) -> tuple["torch.Tensor | None", ...] | None:
    """A transformers DeepSeek-V4 cache layer's compressed entries in the graph's form, one
    row per token (None for the projections of the last tokens, which it drops once their
    window is full), after its keys and values; None for another layer."""
    import torch

    rate, entries = getattr(layer, "compress_rate", None), getattr(layer, "compressed_kv", None)
    if not isinstance(rate, int) or not isinstance(entries, dict):
        return None
    total = layer.cumulative_length
    states: list = []
    for name in entries:
        held = entries[name]
        rows = torch.zeros(layer.keys.shape[0], total, held.shape[-1], dtype=held.dtype)
        rows[:, rate - 1::rate][:, :held.shape[1]] = held
        states += [None, None, rows]
    return (layer.keys, layer.values, *states)


def _state(cache: Any, index: int, hidden: "torch.Tensor") -> tuple[Any, Any]:
    """(layer ``index`` of ``cache``, its past length): (None, 0) without a cache. The
    attention has appended the new keys already."""
    if cache is None:
        return None, 0
    layer = cache.layers[index]
    return layer, layer.keys.shape[2] - hidden.shape[1]


def _windows(module: "torch.nn.Module", layer: Any, prefix: str, hidden: "torch.Tensor",
             past: Any, overlap: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``module``'s compressed rows for the past and the new tokens, ``[batch, past + new,
    head_dim]`` (:func:`_new_rows`), and the new tokens' indices in the cache; the layer's
    states under ``prefix`` updated."""
    import torch

    kv, gate = module.kv_proj(hidden), module.gate_proj(hidden)
    width = module.compress_rate * (2 if overlap else 1)
    named = getattr(layer, "named_states", None) or {}
    held = [named.get(f"{prefix}.{state}") for state in STATES]
    if held[0] is None:
        held = [kv.new_zeros(kv.shape[0], width - 1, kv.shape[-1]),
                gate.new_zeros(gate.shape[0], width - 1, gate.shape[-1]),
                kv.new_zeros(kv.shape[0], 0, module.head_dim)]
    kv = torch.cat((held[0].to(kv.dtype), kv), 1)
    gate = torch.cat((held[1].to(gate.dtype), gate), 1)
    index = torch.arange(hidden.shape[1], device=hidden.device) + past
    rows = _new_rows(module, kv, gate, index, overlap)
    rows = torch.cat((held[2].to(rows.dtype), rows), 1)
    if layer is not None:
        if not hasattr(layer, "named_states"):
            layer.named_states = {}
        layer.named_states.update(zip((f"{prefix}.{state}" for state in STATES),
                                      (kv[:, 1 - width:], gate[:, 1 - width:], rows)))
    return rows, index


def _new_rows(module: "torch.nn.Module", kv: "torch.Tensor", gate: "torch.Tensor",
              index: "torch.Tensor", overlap: bool) -> "torch.Tensor":
    """The compressed row of each new token (``kv`` / ``gate``: the state's rows, then the
    new tokens'; ``index``: the new tokens' in the cache): the softmax-gated sum over the
    window ending at it (CSA: the previous window's first half of the channels beside its
    own second half), normalized and rotated at the window's first position; zeros where
    the token closes no window."""
    import torch

    rate, dim = module.compress_rate, module.head_dim
    width = rate * (2 if overlap else 1)
    # [batch, new, width, channels]; contiguous: torch.export bounds the length otherwise
    kv = kv.unfold(1, width, 1).transpose(2, 3).contiguous()
    gate = gate.unfold(1, width, 1).transpose(2, 3).contiguous()
    bias = module.position_bias
    if overlap:  # the previous window's first halves, then this window's second halves
        first = gate[:, :, :rate, :dim] + bias[:, :dim]
        first = first.masked_fill((index < 2 * rate - 1)[None, :, None, None], float("-inf"))
        gate = torch.cat((first, gate[:, :, rate:, dim:] + bias[:, dim:]), 2)
        kv = torch.cat((kv[:, :, :rate, :dim], kv[:, :, rate:, dim:]), 2)
    else:
        gate = gate + bias
    weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
    rows = module.kv_norm((kv * weights).sum(dim=2))
    positions = (index - rate + 1).clamp(min=0).unsqueeze(0).expand(kv.shape[0], -1)
    cos, sin = module.rotary_emb(rows, position_ids=positions, layer_type=module.rope_layer_type)
    rope = sys.modules[type(module).__module__].apply_rotary_pos_emb
    rows = rope(rows.unsqueeze(1), cos, sin).squeeze(1)
    closes = ((index + 1) % rate == 0)[None, :, None]
    return torch.where(closes, rows, torch.zeros_like(rows))


def _visible(rows: "torch.Tensor", position_ids: "torch.Tensor", rate: int) -> "torch.Tensor":
    """``[batch, new, rows]``: whether each new token sees each compressed row, as
    transformers' compressors say: a row holding an entry (it closes a window) of a window
    ending at or before the token's position."""
    import torch

    row = torch.arange(rows.shape[1], device=rows.device)
    entry = ((row + 1) % rate == 0)[None, None, :]
    return entry & (row[None, None, :] <= position_ids[:, :, None])


def hca_forward(module: "torch.nn.Module", n: int, hidden_states: "torch.Tensor",
                q_residual: "torch.Tensor", position_ids: "torch.Tensor", cache: Any,
                layer_idx: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """transformers' ``DeepseekV4HCACompressor`` (layer ``n``) with its states in its cache
    layer: (the compressed rows ``[batch, 1, rows, head_dim]``, their attention bias
    ``[batch, 1, new, rows]``; a one-token call sees every entry, as transformers')."""
    import torch

    layer, past = _state(cache, layer_idx, hidden_states)
    rows, _ = _windows(module, layer, "compressor", hidden_states, past, overlap=False)
    seen = _visible(rows, position_ids, module.compress_rate)
    one = position_ids.new_ones(position_ids.shape[1]).sum() == 1
    row = torch.arange(rows.shape[1], device=rows.device)
    seen = seen | (one & ((row + 1) % module.compress_rate == 0))[None, None, :]
    bias = rows.new_zeros(seen.shape).masked_fill(~seen, float("-inf"))
    return rows.unsqueeze(1), bias.unsqueeze(1)


def csa_forward(module: "torch.nn.Module", n: int, hidden_states: "torch.Tensor",
                q_residual: "torch.Tensor", position_ids: "torch.Tensor", cache: Any,
                layer_idx: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """transformers' ``DeepseekV4CSACompressor`` (layer ``n``) with its states in its cache
    layer: the compressed rows and their bias, open where its indexer picked a row."""
    import torch

    layer, past = _state(cache, layer_idx, hidden_states)
    rows, _ = _windows(module, layer, "compressor", hidden_states, past, overlap=True)
    picked = module.indexer(hidden_states, q_residual, position_ids, cache, layer_idx)
    total = rows.shape[1]
    safe = torch.where(picked >= 0, picked, torch.full_like(picked, total))
    bias = rows.new_full((rows.shape[0], 1, hidden_states.shape[1], total + 1), float("-inf"))
    bias = bias.scatter(-1, safe.unsqueeze(1), 0.0)
    return rows.unsqueeze(1), bias[..., :total]


def indexer_forward(indexer: "torch.nn.Module", n: int, hidden_states: "torch.Tensor",
                    q_residual: "torch.Tensor", position_ids: "torch.Tensor", cache: Any,
                    layer_idx: int) -> "torch.Tensor":
    """transformers' ``DeepseekV4Indexer`` (layer ``n``) with its states in its cache layer:
    per new token the ``index_topk`` best rows it may see (-1 where fewer, also where
    transformers returns fewer columns)."""
    import torch

    layer, past = _state(cache, layer_idx, hidden_states)
    rows, _ = _windows(indexer, layer, "indexer", hidden_states, past, overlap=True)
    batch, length, _ = hidden_states.shape
    cos, sin = indexer.rotary_emb(hidden_states, position_ids=position_ids,
                                  layer_type=indexer.rope_layer_type)
    rope = sys.modules[type(indexer).__module__].apply_rotary_pos_emb
    q = indexer.q_b_proj(q_residual).view(batch, length, -1, indexer.head_dim).transpose(1, 2)
    q = rope(q, cos, sin).transpose(1, 2)
    scores = indexer.scorer(q, rows, hidden_states)  # [batch, new, rows]
    seen = _visible(rows, position_ids, indexer.compress_rate)
    scores = scores.masked_fill(~seen, float("-inf"))
    # ``index_topk`` columns more, unseen: never fewer than it to choose from (topk of
    # ``min(index_topk, rows)`` is a bound torch.export cannot prove)
    scores = torch.cat((scores, scores.new_full((*scores.shape[:2], indexer.index_topk),
                                                float("-inf"))), -1)
    best = scores.topk(indexer.index_topk, dim=-1)
    return torch.where(best.values == float("-inf"), torch.full_like(best.indices, -1),
                       best.indices)
