"""Higher-order ops: ``invoke_subgraph`` regions are calls of their module; ``cond`` bodies
are not grouped, and the warning says so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import rewrite
from tools import models
from tests.onnx_fixtures import MODULARIZE, assert_matches_eager, checked_proto, function_names


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 4)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return self.out(torch.relu(self.linear(x)))


class Regions(torch.nn.Module):
    """Node names in the region's body (``linear``, ``relu``, ``linear_1``) are also names
    of main-graph nodes."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.post = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = torch.relu(self.pre(x))
        for block in self.blocks:
            x = block(x)
        return self.post(x)


@pytest.fixture(scope="module")
def regions():
    torch.manual_seed(0)
    model, args = models.perturb(Regions().eval()), (torch.randn(2, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, args, strict=True)
    targets = {str(n.target) for n in program.graph.nodes}
    assert any("invoke_subgraph" in t for t in targets)
    return (model, args, {}), program


@pytest.mark.parametrize("text", ["group class *Block", 'include "modularize.rules"'])
def test_each_region_call_is_one_call_of_its_module(regions, text):
    triple, program = regions
    result = rewrite.apply(rewrite.parse_rules(text), program)
    ids = [g.id for g in result.tree.groups()]
    assert {"blocks.0", "blocks.1"} <= set(ids)
    if "modularize" in text:
        assert {"blocks.0/blocks.0.linear", "blocks.1/blocks.1.out", "pre", "post"} <= set(ids)
    assert not result.warnings and not result.tree.flattened
    onnx_model = result.to_onnx()
    checked_proto(onnx_model)
    assert_matches_eager(onnx_model, triple)
    assert function_names(onnx_model)["Block"] == 1  # one body, rewrite's own function
    calls = [n.op_type for n in onnx_model.graph]
    assert calls.count("Block") == 2 and "invoke_subgraph" not in str(calls)
    model, args, _ = triple
    gm = result.to_fx()
    with torch.no_grad():
        np.testing.assert_allclose(gm(*args).numpy(), model(*args).numpy(), atol=1e-6)
    assert type(gm.get_submodule("blocks.1")).__name__ == "Block"
    # the program itself still calls its region
    assert any("invoke_subgraph" in str(n.target) for n in program.graph.nodes)


class Branch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


class Conditional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = Branch(), Branch(), torch.nn.Linear(4, 4)

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: self.a(t), lambda t: self.b(t), (x,))
        return self.head(y)


@pytest.mark.parametrize("strict", [False, True])
def test_modules_inside_cond_are_not_grouped_and_the_warning_says_why(run_cli, tmp_path,
                                                                         strict):
    torch.manual_seed(0)
    model, args = models.perturb(Conditional().eval()), (torch.randn(2, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, args, strict=strict)
    result = rewrite.apply(rewrite.parse_rules("group class *Branch", "c.rules"), program)
    assert [g.id for g in result.tree.groups()] == []
    (warning,) = result.warnings
    assert "matches nothing" in warning.message and "calls cond" in warning.message
    result = rewrite.apply(MODULARIZE, program)
    assert [g.id for g in result.tree.groups()] == ["head"]
    onnx_model = result.to_onnx()
    checked_proto(onnx_model)
    for x in (args[0], -args[0].abs()):  # both branches
        assert_matches_eager(onnx_model, (model, (x,), {}))
