"""RecurrentGemma's recurrent block, MiniMax's lightning attention and RWKV's time and
channel mixing as the export traces them (``rewrite/exporting/checkpoint/module_states.py``:
their states in the cache, one scan over the tokens) compute what transformers' code computes
with its states elsewhere (on the modules, in MiniMax's own cache, in RWKV's own state list):
a prefill of 7 tokens, then two one-token steps, outputs and states."""

from __future__ import annotations

import torch


def test_the_recurrent_block_with_its_states_in_the_cache_equals_transformers():
    from transformers import RecurrentGemmaConfig
    from transformers.cache_utils import LinearAttentionLayer
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import (
        RecurrentGemmaRecurrentBlock,
    )

    from rewrite.exporting.checkpoint.module_states import recurrent_block_forward

    config = RecurrentGemmaConfig(hidden_size=32, lru_width=32, num_attention_heads=4,
                                  conv1d_width=4)
    torch.manual_seed(0)
    block = RecurrentGemmaRecurrentBlock(config, 0).eval()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.3)
    cache = type("Cache", (), {"layers": [LinearAttentionLayer()]})()
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for start, end in ((0, 7), (7, 8), (8, 9)):  # prefill, then two decode steps
            positions = torch.arange(start, end)[None].expand(2, -1)
            expected, _ = block(x[:, start:end], positions, None, use_cache=True)
            got, _ = recurrent_block_forward(block, 0, x[:, start:end], positions,
                                             cache=cache)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            layer = cache.layers[0]
            torch.testing.assert_close(layer.conv_states[0], block.conv1d_state)
            torch.testing.assert_close(layer.recurrent_states[0],
                                       block.rg_lru.recurrent_states, atol=1e-5, rtol=1e-5)


def test_lightning_attention_with_its_state_in_the_cache_equals_transformers():
    """MiniMax's lightning attention: transformers' prefill in blocks of 4 over 7 tokens, then
    its one-token loop twice, against one scan over the tokens with the state in the cache."""
    from transformers import MiniMaxConfig
    from transformers.cache_utils import LinearAttentionLayer
    from transformers.models.minimax.modeling_minimax import (
        MiniMaxCache,
        MiniMaxLightningAttention,
    )

    from rewrite.exporting.checkpoint.module_states import lightning_forward

    config = MiniMaxConfig(hidden_size=32, num_attention_heads=4, head_dim=8,
                           num_hidden_layers=3, block_size=4)
    torch.manual_seed(0)
    attention = MiniMaxLightningAttention(config, 1).eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.3)
    theirs, ours = MiniMaxCache(), type("Cache", (), {"layers": [None, LinearAttentionLayer()]})()
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for start, end in ((0, 7), (7, 8), (8, 9)):  # prefill, then two decode steps
            expected, state = attention(x[:, start:end], None, None, cache=theirs)
            got, our_state = lightning_forward(attention, 1, x[:, start:end], cache=ours)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(our_state, state, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ours.layers[1].recurrent_states[0], state, atol=1e-5,
                                       rtol=1e-5)


def test_rwkv_mixing_with_its_states_in_the_cache_equals_transformers():
    """RWKV's time mixing (transformers' Python loop over the tokens) and channel mixing on
    its own state list, 7 tokens then two one-token steps, against one scan over the tokens
    with the states in the cache's layer: outputs, and the cache's states read back as
    transformers' list."""
    from transformers import DynamicCache, RwkvConfig
    from transformers.models.rwkv.modeling_rwkv import RwkvFeedForward, RwkvSelfAttention

    from rewrite.exporting.checkpoint.module_states import (
        listed_state,
        rwkv_attention_forward,
        rwkv_feed_forward,
        rwkv_layer,
    )

    config = RwkvConfig(hidden_size=32, attention_hidden_size=32, intermediate_size=48,
                        num_hidden_layers=1)
    torch.manual_seed(0)
    attention, feed_forward = RwkvSelfAttention(config, 0).eval(), RwkvFeedForward(config, 0)
    with torch.no_grad():
        for parameter in (*attention.parameters(), *feed_forward.parameters()):
            parameter.normal_(0.0, 0.3)
    state = [torch.zeros(1, 32, 1) for _ in range(5)]
    state[4] -= 1e30  # as RwkvModel starts it
    cache = DynamicCache()
    cache.layers = [rwkv_layer()]
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for start, end in ((0, 7), (7, 8), (8, 9)):  # prefill, then two decode steps
            expected, state = attention(x[:, start:end], state=state, use_cache=True)
            got, _ = rwkv_attention_forward(attention, 0, x[:, start:end], state=cache)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            expected, state = feed_forward(x[:, start:end], state=state)
            got, _ = rwkv_feed_forward(feed_forward, 0, x[:, start:end], state=cache)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            for ours, theirs in zip(listed_state(cache), state):
                torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
