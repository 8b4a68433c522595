"""RecurrentGemma's recurrent block as the export traces it
(``rewrite/exporting/checkpoint/module_states.py``: its states in the cache, one scan over
the tokens) computes what transformers' block computes with its states on the modules: a
prefill of 7 tokens, then two one-token steps, outputs and states."""

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
