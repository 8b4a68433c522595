"""The test models are not degenerate: no two of their weights are equal.

Numeric tests compare rewrite's output with eager PyTorch. That catches a call handed another
layer's weight only if the two weights differ; fresh models have equal biases and norms in
every block (``models.perturb``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tools import models

BUILDERS = {
    "gpt2": models.gpt2,
    "llama": models.llama,
    "llama-head": lambda: models.llama(head=True),
    "bert": models.bert,
    "resnet": models.resnet,
    "two_block_kinds": models.two_block_kinds,
    "shared_and_list": models.shared_and_list,
    "staged": models.staged,
    "stateful": models.stateful,
    "alternating": models.alternating,
    "two_factors": models.two_factors,
    "two_noops": models.two_noops,
    "settings": models.settings,
    "shared_apart": models.shared_apart,
    "chain": models.chain,
    "pair_chain": models.pair_chain,
}


def float_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every floating-point parameter and buffer, each tensor once (tied weights are one)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {name: t for name, t in named if t.is_floating_point()}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_no_two_weights_are_equal(name):
    tensors = float_tensors(BUILDERS[name]()[0])
    assert tensors
    by_shape: dict[tuple, list[str]] = {}
    for key, tensor in tensors.items():
        by_shape.setdefault(tuple(tensor.shape), []).append(key)
    equal = [(a, b) for names in by_shape.values() for a, b in itertools.combinations(names, 2)
             if torch.equal(tensors[a], tensors[b])]
    assert not equal


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_no_weight_is_its_fresh_value(name):
    """Every tensor moved away from what the model's own init gave it."""
    perturbed = float_tensors(BUILDERS[name]()[0])
    model = BUILDERS[name]()[0]
    fresh = type(model)(model.config)
    unchanged = [k for k, t in float_tensors(fresh).items() if torch.equal(t, perturbed[k])]
    assert not unchanged
