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
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch

RECURRENT_BLOCK = "RecurrentGemmaRecurrentBlock"


@contextlib.contextmanager
def states_in_cache(model: "torch.nn.Module") -> Iterator[bool]:
    """``model``'s recurrent blocks keeping their states in the cache while the block runs
    (:func:`recurrent_block_forward`); yields whether it has any."""
    blocks = [(int(re.findall(r"\d+", name)[-1]), module)
              for name, module in model.named_modules()
              if type(module).__name__ == RECURRENT_BLOCK and re.search(r"\d", name)]
    try:
        for n, block in blocks:
            block.forward = functools.partial(recurrent_block_forward, block, n)
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
