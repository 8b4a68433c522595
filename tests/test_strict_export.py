"""Strict exports (``torch.export.export(..., strict=True)``) group like non-strict ones.

In a strict export, the rotary embedding's ``torch.no_grad()`` region of a Llama
(``wrap_with_set_grad_enabled``) and the ``getitem`` nodes unpacking it carry only the root
module's stack, although they run inside ``model.rotary_emb``; read as top level, ``model``
could not be outlined.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rewrite
from tools import models
from tests.onnx_fixtures import (LLAMA_RULES, MODULARIZE, assert_matches_eager, checked_proto,
                                 function_names)


class NoGradInside(torch.nn.Module):
    """A block whose middle runs under ``torch.no_grad()``."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.first(x)
        with torch.no_grad():
            g = h.cos() * 2
        return self.second(h + g)


class TwoBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([NoGradInside(), NoGradInside()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def causal():
    triple = models.llama(head=True)
    return triple, {strict: models.export(triple, strict=strict) for strict in (False, True)}


def groups(rules, program) -> list[str]:
    result = rewrite.apply(rules, program)
    assert not result.tree.flattened, result.tree.flattened
    return [g.id for g in result.tree.groups()]


@pytest.mark.parametrize("rules", [MODULARIZE, LLAMA_RULES])
def test_strict_and_non_strict_give_the_same_groups(causal, rules):
    _, programs = causal
    strict = groups(rules, programs[True])
    assert strict == groups(rules, programs[False])
    assert "model.rotary_emb" in {g.rsplit("/", 1)[-1] for g in strict}


def test_strict_llama_lowers_equal_to_eager(causal):
    triple, programs = causal
    model, args, kwargs = triple
    onnx_model = rewrite.apply(LLAMA_RULES, programs[True]).to_onnx()
    checked_proto(onnx_model)
    assert_matches_eager(onnx_model, triple)
    assert function_names(onnx_model)["LlamaDecoderLayer"] == 1
    gm = rewrite.apply(MODULARIZE, programs[True]).to_fx()
    with torch.no_grad():
        np.testing.assert_allclose(gm(*args, **kwargs)[0].numpy(),
                                   model(*args, **kwargs)[0].numpy(), atol=1e-5)


def test_a_no_grad_region_inside_a_block_stays_in_it():
    torch.manual_seed(0)
    model, args = models.perturb(TwoBlocks().eval()), (torch.randn(2, 4),)
    for strict in (False, True):
        program = torch.export.export(model, args, strict=strict)
        result = rewrite.apply(rewrite.parse_rules("group class *NoGradInside"), program)
        assert [g.id for g in result.tree.groups()] == ["blocks.0", "blocks.1"]
        assert not result.tree.flattened
        onnx_model = result.to_onnx()
        checked_proto(onnx_model)
        assert_matches_eager(onnx_model, (model, args, {}))
        assert function_names(onnx_model)["NoGradInside"] == 1
        with torch.no_grad():
            np.testing.assert_allclose(result.to_fx()(*args).numpy(), model(*args).numpy(),
                                       atol=1e-6)
