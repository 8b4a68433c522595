"""The scans rewrite traces in place of transformers' torch paths
(``rewrite/exporting/checkpoint/scans.py``) compute what those paths compute, eagerly, on
random operands: a gated delta net's chunked rule (chunks of 4 over 7 tokens, grouped heads,
from a state), Kimi's delta attention (its decay per key channel), Mamba-2's chunked scan
(from a state), Mamba's selective scan from zeros and its one-token step from a state."""

from __future__ import annotations

import pytest
import torch

from rewrite.exporting.checkpoint import scans


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_the_gated_delta_rule_as_one_scan_equals_transformers_chunks():
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    batch, length, key_heads, heads, dim = 2, 7, 2, 4, 8
    query, key = (_random(batch, length, key_heads, dim, seed=s) for s in (0, 1))
    value = _random(batch, length, heads, dim, seed=2)
    g, beta = -_random(batch, length, heads, seed=3).abs(), _random(batch, length, heads,
                                                                    seed=4).sigmoid()
    state = _random(batch, heads, dim, dim, seed=5)
    kwargs = dict(g=g, beta=beta, initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
    expected = qwen3_next.torch_chunk_gated_delta_rule(query, key, value, chunk_size=4,
                                                       **kwargs)
    got = scans.scanned_gated_delta_rule(query, key, value, **kwargs)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [1, 7])
def test_kimi_delta_attention_as_one_scan_equals_transformers(length):
    """Kimi's delta attention, its decay per key channel: 7 tokens against transformers'
    chunked rule (chunks of 4), 1 token against its recurrent step, both from a state."""
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    batch, heads, dim = 2, 4, 8
    query, key, value = (_random(batch, length, heads, dim, seed=s) for s in (0, 1, 2))
    g = -_random(batch, length, heads, dim, seed=3).abs()
    beta = _random(batch, length, heads, seed=4).sigmoid()
    kwargs = dict(g=g, beta=beta, initial_state=_random(batch, heads, dim, dim, seed=5),
                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    expected = kimi.recurrent_kimi_delta_attention(query, key, value, **kwargs) if length == 1 \
        else kimi.chunk_kimi_delta_attention(query, key, value, chunk_size=4, **kwargs)
    got = scans.scanned_gated_delta_rule(query, key, value, **kwargs)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)


def test_mamba2_as_one_scan_equals_transformers_chunks():
    from transformers.models.bamba import modeling_bamba as bamba

    batch, length, heads, dim, groups, state_size = 2, 7, 4, 8, 2, 6
    x = _random(batch, length, heads, dim, seed=0)
    dt, A = _random(batch, length, heads, seed=1), -_random(heads, seed=2).abs()
    B, C = (_random(batch, length, groups, state_size, seed=s) for s in (3, 4))
    kwargs = dict(D=_random(heads, seed=5), dt_bias=_random(heads, seed=6), dt_softplus=True,
                  initial_states=_random(batch, heads, dim, state_size, seed=7),
                  return_final_states=True)
    expected = bamba.mamba2_chunk_scan(x, dt, A, B, C, 4, **kwargs)
    got = scans.scanned_mamba2(x, dt, A, B, C, 4, **kwargs)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [1, 7])
def test_mambas_selective_scan_as_one_scan_equals_transformers(length):
    """From zeros as transformers' scan (7 tokens), from the cached state as its one-token
    step (1 token)."""
    from transformers.models.mamba import modeling_mamba as mamba

    batch, channels, state_size = 2, 6, 4
    x, dt = _random(batch, channels, length, seed=0), _random(batch, channels, length, seed=1)
    A = -_random(channels, state_size, seed=2).abs()
    B, C = (_random(batch, state_size, length, seed=s) for s in (3, 4))
    D, z, bias = (_random(*shape, seed=s) for s, shape in
                  ((5, (channels,)), (6, (batch, channels, length)), (7, (channels,))))
    states = scans.MixerStates(torch.nn.Module(), [])  # no mixer hooked: its state set here
    if length == 1:
        states.last = _random(batch, channels, state_size, seed=8)
        cache = states.last.clone()  # the step updates it in place
        out = mamba.mamba_selective_state_update(
            cache, x[..., 0], dt[..., 0], A, B[..., 0], C[..., 0], D, z=z[..., 0],
            dt_bias=bias, dt_softplus=True)[..., None]
        expected = (out, cache)
    else:
        expected = mamba.mamba_selective_scan(x, dt, A, B, C, D=D, z=z, delta_bias=bias,
                                              delta_softplus=True, return_last_state=True)
    got = scans.scanned_selective_scan(states, x, dt, A, B, C, D=D, z=z, delta_bias=bias,
                                       delta_softplus=True, return_last_state=True)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)


def test_a_mixer_scanning_head_by_head_starts_each_head_from_its_own_state():
    """Zamba's mixer scans its heads in order, each with ``A [channels, state]``, from one
    cached state ``[batch, heads, channels, state]``: each scan reads its head's slice."""
    from transformers.models.mamba import modeling_mamba as mamba

    batch, heads, channels, state_size = 2, 3, 6, 4
    states = scans.MixerStates(torch.nn.Module(), [])
    states.last = _random(batch, heads, channels, state_size, seed=8)
    for head in range(heads):
        x, dt = _random(batch, channels, 1, seed=head), _random(batch, channels, 1, seed=9)
        A = -_random(channels, state_size, seed=10 + head).abs()
        B, C = (_random(batch, state_size, 1, seed=s) for s in (3, 4))
        cache = states.last[:, head].clone()
        expected = mamba.mamba_selective_state_update(cache, x[..., 0], dt[..., 0], A,
                                                      B[..., 0], C[..., 0])[..., None]
        got, last = scans.scanned_selective_scan(states, x, dt, A, B, C,
                                                 return_last_state=True)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last, cache, atol=1e-5, rtol=1e-5)
