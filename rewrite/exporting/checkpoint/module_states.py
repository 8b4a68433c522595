"""Recurrent layers whose transformers code keeps its state on its modules, not in the cache:
RecurrentGemma's recurrent blocks (Griffin's: a short convolution, then the RG-LRU
recurrence). transformers keeps the convolution's last inputs on the block
(``conv1d_state``) and the recurrent state on its RG-LRU (``recurrent_states``), leaves the
cache's ``LinearAttentionLayer`` empty, picks its path by the call's length (a one-token
step or a prefill), and loops over the tokens in Python.

While the cache layout is read and while exporting, :func:`states_in_cache` gives each such
block a forward that keeps both states in its layer of the cache (``conv_states[0]``,
``recurrent_states[0]``, as a Mamba layer's), the same for every length: the convolution
over the state and the new inputs, the recurrence as one ``torch.scan`` over the tokens
from the state (an ONNX ``Scan``). So the states are ``past.N.conv [batch, lru_width,
conv1d_width - 1]`` and ``past.N.recurrent [batch, lru_width]`` (float32, as transformers
keeps it) like any hybrid's. Numbers as transformers': the state restarts at position 0
(``reset``), the recurrence runs in float32. One difference: a multi-token call after
earlier tokens continues their convolution state, where transformers' prefill path starts
it from zeros (a prompt fed in pieces equals one prefill of it).

MiniMax's lightning attention layers keep their state, ``[batch, heads, head_dim, head_dim]``,
in a cache class of the model's own (``MiniMaxCache``, a list beside its layers; the model
refuses any other cache): :func:`own_cache` makes one holding the layers transformers
gives the config, and :func:`states_in_cache` gives each such layer a forward that keeps its
state in its layer of the cache (``recurrent_states[0]``), its recurrence (transformers'
blocks of ``block_size`` tokens for a prefill, a Python loop over the tokens after) one
scan over the tokens from it: ``past.N.recurrent`` with no convolution state.

Inkling's short convolutions (four per layer, beside its keys and values) keep their states
in the cache already, but update them in place (``copy_``), which the per-layer trace cannot
follow: their forward keeps each state by assignment instead, the same convolution
(:func:`short_convolution_forward`).

DeepSeek-V4's compressors and indexer keep their states in the cache as tensors of fixed or
past-long shapes (:mod:`~rewrite.exporting.checkpoint.compressed`).
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, Any, Iterator

from rewrite.exporting.checkpoint.compressed import csa_forward, hca_forward, indexer_forward

if TYPE_CHECKING:
    import torch

FORWARDS = {"RecurrentGemmaRecurrentBlock": "recurrent_block_forward",
            "MiniMaxLightningAttention": "lightning_forward",
            "InklingShortConvolution": "short_convolution_forward",
            "RwkvSelfAttention": "rwkv_attention_forward",
            "RwkvFeedForward": "rwkv_feed_forward",
            "DeepseekV4HCACompressor": "hca_forward",
            "DeepseekV4CSACompressor": "csa_forward",
            "DeepseekV4Indexer": "indexer_forward"}
"""The classes whose state transformers keeps outside its cache layers, and the forward
(of this module) each has while the cache layout is read and while exporting."""


@contextlib.contextmanager
def states_in_cache(model: "torch.nn.Module") -> Iterator[bool]:
    """``model``'s layers of :data:`FORWARDS` keeping their states in their layers of the
    cache while the block runs; yields whether it has any."""
    blocks = [(int(re.findall(r"\d+", name)[-1]), module)
              for name, module in model.named_modules()
              if type(module).__name__ in FORWARDS and re.search(r"\d", name)]
    forwards = {**globals(), "hca_forward": hca_forward, "csa_forward": csa_forward,
                "indexer_forward": indexer_forward}
    try:
        for n, block in blocks:
            block.forward = functools.partial(forwards[FORWARDS[type(block).__name__]],
                                              block, n)
        yield bool(blocks)
    finally:
        for _, block in blocks:
            del block.forward


def recurrent_block_forward(block: "torch.nn.Module", n: int, input_states: "torch.Tensor",
                            position_ids: "torch.Tensor", attention_mask: Any = None,
                            use_cache: bool = True, cache: Any = None, **kwargs: Any
                            ) -> tuple["torch.Tensor", None]:
    """RecurrentGemma's recurrent block (layer ``n``) with its states in ``cache.layers[n]``
    (zeros when it holds none: no token before), for any number of tokens."""
    import torch
    import torch.nn.functional as F

    layer = cache.layers[n] if cache is not None and use_cache else None
    y = block.act_fn(block.linear_y(input_states))
    x = block.linear_x(input_states).transpose(1, 2)
    width = block.conv1d_width - 1
    conv = None if layer is None else layer.conv_states.get(0)
    conv = x.new_zeros(x.shape[0], x.shape[1], width) if conv is None else conv.to(x.dtype)
    full = torch.cat((conv, x), -1)
    x = F.conv1d(full, block.conv_1d.weight, block.conv_1d.bias, groups=block.conv_1d.groups)
    state = None if layer is None else layer.recurrent_states.get(0)
    x, state = rg_lru(block.rg_lru, x.transpose(1, 2), position_ids, state)
    if layer is not None:
        layer.conv_states[0], layer.recurrent_states[0] = full[..., -width:], state
        layer.conv_kernel_size[0], layer.dtype, layer.device = width, full.dtype, full.device
        layer.is_conv_states_initialized[0] = layer.has_previous_state[0] = True
        layer.is_recurrent_states_initialized[0] = True
    return block.linear_out(x * y), None


def rg_lru(lru: "torch.nn.Module", x: "torch.Tensor", position_ids: "torch.Tensor",
           state: "torch.Tensor | None") -> tuple["torch.Tensor", "torch.Tensor"]:
    """transformers' ``RecurrentGemmaRglru`` on ``x [batch, length, width]`` from ``state
    [batch, width]`` (float32; zeros when None), its recurrence one scan over the tokens:
    (output ``[batch, length, width]``, the last state)."""
    import torch
    import torch.nn.functional as F
    from torch._higher_order_ops.scan import scan

    batch, length, width = x.shape
    reset = position_ids[:, :, None] == 0
    heads = x.reshape(batch * length, lru.num_attention_heads, lru.block_width).permute(1, 0, 2)

    def gate(weight: "torch.Tensor", bias: "torch.Tensor") -> "torch.Tensor":
        product = torch.baddbmm(bias[:, None, :], heads, weight)
        return torch.sigmoid(product.transpose(0, 1).reshape(batch, length, width))

    log_a = -8.0 * gate(lru.recurrent_gate_weight, lru.recurrent_gate_bias) \
        * F.softplus(lru.recurrent_param)
    multiplier = torch.sqrt(1 - torch.exp(2 * log_a))
    multiplier = reset + ~reset * multiplier
    normalized = x * gate(lru.input_gate_weight, lru.input_gate_bias) * multiplier.type(x.dtype)
    a = (torch.exp(log_a) * ~reset).float()
    state = x.new_zeros(batch, width, dtype=torch.float32) if state is None else state.float()
    state, out = scan(_lru_step, state, (a.movedim(1, 0), normalized.float().movedim(1, 0)))
    return out.movedim(0, 1).to(x.dtype), state


def _lru_step(state: "torch.Tensor", token: tuple["torch.Tensor", "torch.Tensor"]
              ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's RG-LRU update of ``state [batch, width]`` (``token``: its decay and
    normalized input): (new state, the token's output)."""
    a, x = token
    state = a * state + x
    return state.clone(), state


def own_cache(model: "torch.nn.Module", cache: Any) -> Any:
    """``cache`` (transformers' ``DynamicCache`` for ``model``'s config), or its layers in
    the cache class of ``model``'s own where its modeling module has one that keeps lightning
    attention states (MiniMax's ``MiniMaxCache``, which its forward requires)."""
    import sys

    from transformers import DynamicCache

    module = sys.modules.get(type(model).__module__)
    own = [value for value in vars(module).values() if isinstance(value, type)
           and issubclass(value, DynamicCache) and hasattr(value, "set_linear_cache")] \
        if module is not None else []
    if len(own) != 1:
        return cache
    made = own[0]()
    made.layers, made.linear_cache = cache.layers, [None] * len(cache.layers)
    return made


def lightning_forward(attention: "torch.nn.Module", n: int, hidden_states: "torch.Tensor",
                      position_embeddings: Any = None, attention_mask: Any = None,
                      cache: Any = None, **kwargs: Any) -> tuple["torch.Tensor", "torch.Tensor"]:
    """MiniMax's lightning attention (layer ``n``) with its state ``[batch, heads, head_dim,
    head_dim]`` in ``cache.layers[n]`` (zeros when it holds none), its recurrence one scan
    over the tokens: (output, the last state)."""
    import sys

    import torch
    from torch._higher_order_ops.scan import scan

    batch, length, _ = hidden_states.shape
    heads, dim = attention.num_attention_heads, attention.head_dim
    masked = sys.modules[type(attention).__module__].apply_mask_to_padding_states
    qkv = masked(attention.act_fn(attention.qkv_proj(hidden_states)), attention_mask)
    query, key, value = torch.split(qkv.reshape(batch, length, heads, 3 * dim), dim, dim=3)
    layer = cache.layers[n] if cache is not None else None
    state = None if layer is None else layer.recurrent_states.get(0)
    state = value.new_zeros(batch, heads, dim, dim) if state is None else state
    decay = torch.exp(-attention.slope_rate).reshape(1, heads, 1, 1).expand(
        length, batch, heads, 1, 1)
    state, out = scan(_lightning_step, state, (decay, *(t.movedim(1, 0) for t in (
        query, key, value))))
    out = attention.norm(out.movedim(0, 1).reshape(batch, length, heads * dim))
    out = attention.out_proj(torch.sigmoid(attention.output_gate(hidden_states)) * out)
    if layer is not None:
        layer.recurrent_states[0], layer.is_recurrent_states_initialized[0] = state, True
        layer.dtype, layer.device = state.dtype, state.device
    return out, state


def _lightning_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
                    ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's lightning attention update of ``state [batch, heads, head_dim,
    head_dim]`` (``token``: its decay ``[batch, heads, 1, 1]``, query, key and value
    ``[batch, heads, head_dim]``): (new state, the token's output)."""
    decay, query, key, value = token
    state = decay * state + key[..., :, None] * value[..., None, :]
    return state.clone(), (query[..., :, None] * state).sum(-2)


def short_convolution_forward(conv: "torch.nn.Module", n: int, hidden_states: "torch.Tensor",
                              cache: Any = None, conv_mask: Any = None, **kwargs: Any
                              ) -> "torch.Tensor":
    """Inkling's short convolution (layer ``n``'s state ``conv.conv_idx``, ``[batch,
    channels, conv_kernel_size]``, zeros when unset) over the state and the new tokens, in
    float32 with its residual, as transformers computes it; the state kept by assignment."""
    import sys

    import torch
    import torch.nn.functional as F

    masked = sys.modules[type(conv).__module__].apply_mask_to_padding_states
    residual = hidden_states.float()
    x = masked(residual, conv_mask).transpose(1, 2)
    layer = cache.layers[n] if cache is not None else None
    k, width = conv.conv_idx, conv.conv_kernel_size
    state = None if layer is None else layer.conv_states.get(k)
    state = x.new_zeros(*x.shape[:2], width) if state is None else state.to(x.dtype)
    full = torch.cat((state, x), -1)
    weight = conv.conv1d.weight
    out = F.conv1d(full.to(weight.dtype), weight, conv.conv1d.bias, groups=weight.shape[0])
    if layer is not None:
        layer.conv_states[k], layer.conv_kernel_size[k] = full[..., -width:], width
        layer.is_conv_states_initialized[k] = layer.has_previous_state[k] = True
        layer.dtype, layer.device = full.dtype, full.device
    out = out[..., -x.shape[-1]:].to(x.dtype).transpose(1, 2)
    return (out + residual).to(hidden_states.dtype)


def rwkv_cache(model: "torch.nn.Module", cache: Any) -> Any:
    """``cache`` with, for a model that keeps a state list of its own (RWKV's forward takes
    ``state``), one linear-attention layer per layer holding two convolution states and a
    recurrent state (its token shifts, its WKV state); ``cache`` unchanged otherwise."""
    import inspect

    if "state" not in inspect.signature(type(model).forward).parameters:
        return cache
    cache.layers = [rwkv_layer() for _ in cache.layers]
    return cache


def rwkv_layer() -> Any:
    """An empty cache layer for an RWKV layer: two convolution states (its token shifts) and
    one recurrent state (its WKV state)."""
    from transformers.cache_utils import LinearAttentionLayer

    layer = LinearAttentionLayer(number_of_states=2)
    del layer.recurrent_states[1]
    return layer


def listed_state(cache: Any) -> "list[torch.Tensor] | None":
    """RWKV's own state list (feed-forward shifts, attention shifts, numerators,
    denominators, largest exponents: each ``[batch, hidden, layers]``) from ``cache``'s
    layers (:func:`rwkv_cache`); None before the first token (RWKV starts its own)."""
    import torch

    layers = cache.layers
    if layers[0].conv_states.get(0) is None:
        return None
    shifts = [torch.stack([layer.conv_states[k][..., 0] for layer in layers], -1)
              for k in (1, 0)]
    wkv = torch.stack([layer.recurrent_states[0] for layer in layers], -1)
    return [*shifts, *wkv.unbind(1)]


def keep_listed_state(cache: Any, state: "list[torch.Tensor]") -> None:
    """RWKV's own state list (:func:`listed_state`'s order) as ``cache``'s layers'."""
    import torch

    for n, layer in enumerate(cache.layers):
        _keep(layer, 0, state[1][..., n, None])
        _keep(layer, 1, state[0][..., n, None])
        _keep(layer, None, torch.stack([s[..., n] for s in state[2:]], 1))


def _keep(layer: Any, k: int | None, state: "torch.Tensor") -> None:
    """``state`` as ``layer``'s convolution state ``k`` (its recurrent state: None), marked
    as following earlier tokens."""
    if k is None:
        layer.recurrent_states[0], layer.is_recurrent_states_initialized[0] = state, True
    else:
        layer.conv_states[k], layer.conv_kernel_size[k] = state, state.shape[-1]
        layer.is_conv_states_initialized[k] = layer.has_previous_state[k] = True
    layer.dtype, layer.device = state.dtype, state.device


def _shifted(hidden: "torch.Tensor", shift: "torch.Tensor | None") -> "torch.Tensor":
    """RWKV's token shift of ``hidden [batch, length, width]``: each token's previous, the
    first's from ``shift [batch, width, 1]`` (zeros when None: no token before)."""
    import torch

    first = hidden.new_zeros(hidden.shape[0], 1, hidden.shape[2]) if shift is None \
        else shift.transpose(1, 2).to(hidden.dtype)
    return torch.cat((first, hidden), 1)[:, :-1]


def rwkv_attention_forward(attention: "torch.nn.Module", n: int, hidden: "torch.Tensor",
                           state: Any = None, use_cache: bool = False
                           ) -> tuple["torch.Tensor", Any]:
    """RWKV's time mixing (layer ``n``) with its shift and WKV state in ``state.layers[n]``
    (a cache: :func:`rwkv_cache`; None: from zeros, kept nowhere), the recurrence one scan
    (:func:`wkv`); transformers' own on its own state list."""
    import torch
    from transformers.cache_utils import Cache

    if state is not None and not isinstance(state, Cache):
        return type(attention).forward(attention, hidden, state=state, use_cache=use_cache)
    layer = None if state is None else state.layers[n]
    shifted = _shifted(hidden, None if layer is None else layer.conv_states.get(0))

    def mixed(weight: "torch.Tensor") -> "torch.Tensor":
        return hidden * weight + shifted * (1 - weight)

    key = attention.key(mixed(attention.time_mix_key))
    value = attention.value(mixed(attention.time_mix_value))
    receptance = torch.sigmoid(attention.receptance(mixed(attention.time_mix_receptance)))
    out, recurrent = wkv(attention.time_decay, attention.time_first, key, value,
                         None if layer is None else layer.recurrent_states.get(0))
    if layer is not None:
        _keep(layer, 0, hidden[:, -1:].transpose(1, 2))
        _keep(layer, None, recurrent)
    return attention.output(receptance * out), state


def rwkv_feed_forward(feed_forward: "torch.nn.Module", n: int, hidden: "torch.Tensor",
                      state: Any = None) -> tuple["torch.Tensor", Any]:
    """RWKV's channel mixing (layer ``n``) with its shift in ``state.layers[n]`` (a cache:
    :func:`rwkv_cache`; None: from zeros, kept nowhere); transformers' own on its own state
    list."""
    import torch
    from transformers.cache_utils import Cache

    if state is not None and not isinstance(state, Cache):
        return type(feed_forward).forward(feed_forward, hidden, state=state)
    layer = None if state is None else state.layers[n]
    shifted = _shifted(hidden, None if layer is None else layer.conv_states.get(1))
    mix_key, mix_receptance = feed_forward.time_mix_key, feed_forward.time_mix_receptance
    key = torch.square(torch.relu(feed_forward.key(
        hidden * mix_key + shifted * (1 - mix_key))))
    receptance = torch.sigmoid(feed_forward.receptance(
        hidden * mix_receptance + shifted * (1 - mix_receptance)))
    if layer is not None:
        _keep(layer, 1, hidden[:, -1:].transpose(1, 2))
    return receptance * feed_forward.value(key), state


def wkv(time_decay: "torch.Tensor", time_first: "torch.Tensor", key: "torch.Tensor",
        value: "torch.Tensor", state: "torch.Tensor | None"
        ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """transformers' ``rwkv_linear_attention_cpu`` on ``key``, ``value [batch, length,
    width]`` from ``state [batch, 3, width]`` (numerator, denominator, largest exponent;
    zeros when None), in float32, one scan over the tokens: (output, the last state). A
    state whose denominator is 0 follows no token: its exponent starts at transformers'
    -1e30, so zeros start it as transformers does."""
    import torch
    from torch._higher_order_ops.scan import scan

    batch, length, width = key.shape
    state = key.new_zeros(batch, 3, width, dtype=torch.float32) if state is None \
        else state.float()
    numerator, denominator, exponent = state.unbind(1)
    exponent = torch.where(denominator == 0, torch.full_like(exponent, -1e30), exponent)
    decay = -torch.exp(time_decay.float())
    tokens = (key.float().movedim(1, 0), value.float().movedim(1, 0),
              decay.expand(length, batch, width), time_first.float().expand(length, batch, width))
    state, out = scan(_wkv_step, torch.stack((numerator, denominator, exponent), 1), tokens)
    return out.movedim(0, 1).to(key.dtype), state


def _wkv_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
              ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's WKV update of ``state [batch, 3, width]`` (``token``: its key, value,
    the decay and the first token's bonus): (new state, the token's output)."""
    import torch

    key, value, decay, first = token
    numerator, denominator, exponent = state.unbind(1)
    top = torch.maximum(exponent, key + first)
    old, new = torch.exp(exponent - top), torch.exp(key + first - top)
    out = (old * numerator + new * value) / (old * denominator + new)
    top = torch.maximum(exponent + decay, key)
    old, new = torch.exp(exponent + decay - top), torch.exp(key - top)
    state = torch.stack((old * numerator + new * value, old * denominator + new, top), 1)
    return state.clone(), out
