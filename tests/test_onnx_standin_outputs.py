"""A stand-in's outputs reach their readers in order: blocks with two and three outputs of one
shape (a swap still makes a valid model, only the numbers tell), read out of their order, and
one output read twice (in order: ``test_onnx_standins``). Per body, the second and third
blocks stand in; the result passes the full checker and equals eager, as the flat path's does.
"""

from __future__ import annotations

import pytest
import torch

import rewrite
from tools.models import Pair, export, perturb
from tests.onnx_fixtures import assert_matches_eager, checked_proto
from tests.test_onnx_perbody import _both, _same_result


class Three(Pair):
    """``Pair`` with a third output, of the same shape."""

    def __init__(self, width: int = 4) -> None:
        super().__init__(width)
        self.third = torch.nn.Linear(width, width)

    def forward(self, x):
        h, gate = super().forward(x)
        return gate, torch.tanh(self.third(x)), h


def _reversed(outputs):
    return outputs[-1] * 3 - outputs[0] + 0.5 * sum(outputs[1:-1], torch.zeros(()))


def _one_twice(outputs):
    """The last output read twice, the first once, any other not at all."""
    return outputs[-1] * outputs[-1] - 2 * outputs[0]


class Chain(torch.nn.Module):
    """Three blocks of one class; each block's outputs, combined by ``read``, make the next
    block's input."""

    def __init__(self, block: type[torch.nn.Module], read) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([block() for _ in range(3)])
        self.read = read

    def forward(self, x):
        for block in self.blocks:
            x = self.read(block(x))
        return x


@pytest.mark.parametrize("block, read", [(Pair, _reversed), (Three, _reversed),
                                         (Three, _one_twice)])
def test_stand_in_outputs_reach_their_readers(block, read):
    torch.manual_seed(0)
    triple = (perturb(Chain(block, read).eval()), (torch.randn(2, 4),), {})
    fast, flat = _both(rewrite.parse_rules(f"group class {block.__name__}"), export(triple))
    assert fast.inlined == 1  # blocks 2 and 3 stood in
    _same_result(fast, flat)
    checked_proto(fast.model)
    assert_matches_eager(fast.model, triple)
    assert_matches_eager(flat.model, triple)
