"""FX backend: the exact submodule tree, names and signatures on hand-sized models."""

from __future__ import annotations

import torch

import rewrite
from tools import models
from tests.test_fx_modularize import assert_same_outputs

MODULARIZE = "rules/modularize.rules"


def tree_of(gm: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(m).__name__) for name, m in gm.named_modules()]


def placeholders(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def calls(gm: torch.fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_submodule_tree_of_shared_and_list(shared_program):
    gm = rewrite.apply(MODULARIZE, shared_program).to_fx()
    assert tree_of(gm) == [
        ("", "SharedAndList"),
        ("shared", "Sub"),
        ("shared.lin", "Linear"),
        ("shared_call1", "Sub"),
        ("shared_call1.lin", "Linear"),
        ("layers", "Module"),
        ("layers.0", "Sub"),
        ("layers.0.lin", "Linear"),
        ("layers.1", "Sub"),
        ("layers.1.lin", "Linear"),
        ("layers.2", "Sub"),
        ("layers.2.lin", "Linear"),
        ("heads", "SplitHeads"),
        ("heads.proj", "Linear"),
    ]
    assert calls(gm) == ["shared", "shared_call1", "layers.0", "layers.1", "layers.2", "heads"]
    assert placeholders(gm) == ["x"]
    # the first call holds the weights; the second gets them from its caller
    assert placeholders(gm.shared) == ["x"]
    assert placeholders(gm.shared_call1) == ["relu", "shared_lin_weight", "shared_lin_bias"]
    assert [n.target for n in gm.shared.lin.graph.nodes if n.op == "get_attr"] == ["weight", "bias"]
    assert calls(gm.shared_call1) == ["lin"]
    # identical calls read the same: local names, same code
    assert gm.get_submodule("layers.0").code == gm.get_submodule("layers.2").code
    out = next(n for n in gm.heads.graph.nodes if n.op == "output")
    assert [a.name for a in out.args[0]] == ["tanh", "sigmoid"]
    assert gm.meta["rewrite"]["kind"] == "root"
    assert gm.shared_call1.meta["rewrite"]["group"] == "shared@1"


def test_readable_code(shared_program):
    gm = rewrite.apply(MODULARIZE, shared_program).to_fx()
    text = gm.print_readable(print_output=False)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "class SharedAndList(torch.nn.Module):"
    for header in ("class shared(torch.nn.Module):", "class shared_call1(torch.nn.Module):",
                   "class layers_0(torch.nn.Module):", "class heads(torch.nn.Module):",
                   "class lin(torch.nn.Module):", "class proj(torch.nn.Module):"):
        assert header in lines
    assert "# shared@1: tools.models.Sub (rule rules/modularize.rules:3)" in lines
    assert any(line.startswith("shared_call1") and "self.shared_call1(shared" in line
               for line in lines)


class Clash(torch.nn.Module):
    """``block`` called twice next to a real attribute named ``block_call1``."""

    def __init__(self):
        super().__init__()
        self.block = models.Sub()
        self.block_call1 = models.Sub()

    def forward(self, x):
        return self.block_call1(self.block(self.block(x) + 1))


def test_names_never_clash():
    torch.manual_seed(0)
    model, args = models.perturb(Clash().eval()), (torch.randn(2, 4),)
    program = models.export((model, args, {}))
    gm = rewrite.apply(MODULARIZE, program).to_fx()
    assert calls(gm) == ["block", "block_call1_1", "block_call1"]
    assert gm.block_call1_1.meta["rewrite"]["group"] == "block@1"
    assert gm.block_call1.meta["rewrite"]["group"] == "block_call1"
    assert set(gm.state_dict()) == set(model.state_dict())
    assert_same_outputs(gm(*args), model(*args))


def test_split_component_named_like_a_module_keeps_both():
    model, args, _ = models.staged()
    program = models.export((model, args, {}))
    rules = rewrite.parse_rules(
        'tag path enc with part = "enc"\n'
        'tag path mid or path dec with part = "dec"\n'
        "split by part\n"
    )
    gm = rewrite.apply(rules, program).to_fx()
    assert calls(gm) == ["enc_1", "dec_1"]  # `enc`, `dec` are the model's own modules
    assert gm.enc_1.meta["rewrite"]["group"] == "enc"
    assert_same_outputs(gm(*args), model(*args))
