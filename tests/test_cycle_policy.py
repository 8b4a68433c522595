"""``on cycle error | flatten``: what happens to a group that cannot be outlined.

The model: ``blk`` runs two linears with a multiplication between them, and the program's
metadata says the multiplication ran in another module (as after a pass that moved metadata
between modules): data leaves ``blk`` and comes back, so ``blk`` cannot be outlined.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

import rewrite
from rewrite.grouping import group_graph
from tools import models
from tests.ir_builder import GraphBuilder, call
from tests.onnx_fixtures import MODULARIZE, assert_matches_eager, checked_proto


class Leaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x) * 2).relu()


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blk = Leaky()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blk(x) + 1)


@pytest.fixture(scope="module")
def leaky():
    torch.manual_seed(0)
    model = models.perturb(Outer().eval())
    args = (torch.randn(2, 4),)
    program = torch.export.export(model, args)
    mul = next(n for n in program.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    root = {k: v for k, v in mul.meta["nn_module_stack"].items() if v[0] == ""}
    mul.meta["nn_module_stack"] = {**root, "other": ("other", "tests.Other")}
    return (model, args, {}), program


@pytest.fixture(scope="module")
def leaky_pt2(leaky, tmp_path_factory):
    path = tmp_path_factory.mktemp("leaky") / "leaky.pt2"
    torch.export.save(leaky[1], str(path))
    return path


# --- the statement -----------------------------------------------------------------------------


def test_policy_parses_and_the_last_statement_wins():
    assert rewrite.parse_rules("group any").on_cycle.action == "error"
    rules = rewrite.parse_rules('include "modularize.rules"\non cycle error\n')
    assert rules.on_cycle.action == "error"
    assert rewrite.parse_rules('include "modularize.rules"').on_cycle.flatten
    # the words stay usable as paths and classes
    assert len(rewrite.parse_rules("group path on or path cycle\nflat class flatten").rules) == 2


def test_unknown_policy_is_a_rules_error(run_cli, tmp_path):
    rules = tmp_path / "p.rules"
    rules.write_text("group any\non cycle flaten\n")
    r = run_cli("check", rules)
    assert r.code == 1, r
    assert r.err.startswith(f"{rules}:2:10: error: unknown cycle policy 'flaten'")
    assert "did you mean 'flatten'?" in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("text, where", [("group any\non cycle\n", "2:9"),
                                         ('on cycle "flatten"\n', "1:10")])
def test_missing_policy_is_a_rules_error(text, where):
    with pytest.raises(rewrite.RuleError) as info:
        rewrite.parse_rules(text, "p.rules")
    assert str(info.value).startswith(f"p.rules:{where}: error: 'on cycle' needs a policy")


def test_flatten_moves_children_up_and_checks_again():
    """a holds child c; flattening a puts c (and a's own nodes) at the top level."""
    a, c, b, other = call("a"), call("a.c"), call("b"), call("other")
    g = GraphBuilder()
    x = g.input()
    a1 = g.op("a1", inputs=[x], stack=(a, c))
    t = g.op("t", inputs=[a1], stack=(other,))
    a2 = g.op("a2", inputs=[a1, t], stack=(a,))
    b1 = g.op("b1", inputs=[a2], stack=(b,))
    g.output([b1])
    rules = rewrite.parse_rules("group any and not path other\non cycle flatten", "x.rules")
    tree = group_graph(rules, g.graph())
    assert [grp.id for grp in tree.groups()] == ["a.c", "b"]
    assert [(f.id, f.into, f.origin) for f in tree.flattened] == [("a", "", "x.rules:1")]
    assert set(tree.flattened[0].nodes) == {"a1", "t", "a2"}
    warning = tree.warnings[-1].render()
    assert warning.startswith("x.rules:1:1: warning: group a cannot be outlined")
    assert "flattened it (on cycle flatten): its nodes go to the top level" in warning
    assert "nodes involved: a1, t, a2" in warning


# --- the CLI and both backends -----------------------------------------------------------------


def test_error_policy_stops_with_the_rule(run_cli, tmp_path, leaky_pt2):
    rules = tmp_path / "e.rules"
    rules.write_text("group path blk\non cycle error\n")
    r = run_cli("apply", rules, leaky_pt2, "-o", tmp_path / "out.onnx")
    assert r.code == 1, r
    assert r.err.startswith(f"{rules}:1: error: group blk cannot be outlined")
    assert "Traceback" not in r.err
    assert not (tmp_path / "out.onnx").exists()


def test_flatten_policy_lowers_to_onnx_and_fx_equal_to_eager(run_cli, tmp_path, leaky,
                                                              leaky_pt2):
    rules = tmp_path / "f.rules"
    rules.write_text("group path blk or path blk.* or path head\non cycle flatten\n")
    out = tmp_path / "out.onnx"
    r = run_cli("apply", rules, leaky_pt2, "-o", out)
    assert r.code == 0, r
    assert f"{rules}:1:1: warning: group blk cannot be outlined" in r.err
    assert "flattened it (on cycle flatten)" in r.err
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert_matches_eager(model, leaky[0])
    names = {f.name for f in model.functions}  # blk's linears (one body) and head: no Leaky
    assert len(names) == 2 and all(n.startswith("Linear") for n in names), names

    result = rewrite.apply(rules, leaky[1])
    assert [g.id for g in result.tree.groups()] == ["blk.first", "blk.second", "head"]
    checked_proto(result.to_onnx())
    gm = result.to_fx()
    (x,) = leaky[0][1]
    with torch.no_grad():
        np.testing.assert_allclose(gm(x).numpy(), leaky[0][0](x).numpy(), atol=1e-6)
    assert not any(type(m).__name__ == "Leaky" for m in gm.modules())


def test_explain_marks_the_flattened_group(run_cli, tmp_path, leaky_pt2):
    r = run_cli("explain", MODULARIZE, leaky_pt2)  # a shipped file: flatten
    assert r.code == 0, r
    assert "flattened blk (Leaky, " in r.out and "modularize.rules:" in r.out
    assert "its nodes are in the top level" in r.out
    r = run_cli("explain", MODULARIZE, leaky_pt2, "--json")
    assert r.code == 0, r
    (flat,) = json.loads(r.out)["flattened"]
    assert (flat["id"], flat["path"], flat["into"]) == ("blk", "blk", "")
    assert flat["class"].endswith("Leaky") and flat["rule"].endswith("modularize.rules:3")
    assert {"mul", "linear_1"} <= set(flat["nodes"])
    assert flat["reason"].startswith("group blk cannot be outlined")


# --- malformed module stacks: one call nested in two places ------------------------------------


def test_a_child_moved_up_beside_a_group_of_the_same_call_merges_with_it():
    """Most of h.m's nodes say (h, h.m); one says (h.m, h), as a stack written in reverse.
    h has a cycle through the top-level h.m; flattened, its child h/h.m lands beside that h.m:
    one group per call, so ids stay unique and the outliner sees the cycle-free tree."""
    h, hm = call("h", "pkg.H"), call("h.m", "pkg.M")
    g = GraphBuilder()
    x = g.input()
    n1 = g.op("n1", inputs=[x], stack=(h, hm))
    n2 = g.op("n2", inputs=[n1], stack=(hm, h))
    n3 = g.op("n3", inputs=[n1, n2], stack=(h, hm))
    n4 = g.op("n4", inputs=[n3], stack=(h,))
    g.output([n4])
    tree = group_graph(rewrite.parse_rules("group any\non cycle flatten", "x.rules"), g.graph())
    assert [(f.id, f.into) for f in tree.flattened] == [("h", "")]
    groups = {grp.id: ([tree.graph.nodes[i].name for i in grp.nodes], [c.id for c in grp.children])
              for grp in tree.groups()}
    assert groups == {"h.m": (["n1", "n3"], ["h.m/h"]), "h.m/h": (["n2"], [])}
    assert dict(zip([n.name for n in tree.graph.nodes], tree.owner))["n4"] == ""


@pytest.fixture(scope="module")
def reversed_stack_gpt2(gpt2_model):
    """The test GPT-2 with one node of block 0's MLP activation carrying its module stack in
    reverse order (as the fuzzer's ``nn_module_stack`` mutation writes it)."""
    program = models.export(gpt2_model)
    node = next(n for n in program.graph.nodes if n.target == torch.ops.aten.pow.Tensor_Scalar)
    stack = node.meta["nn_module_stack"]
    assert [path for path, _ in stack.values()][-1] == "h.0.mlp.act"
    node.meta["nn_module_stack"] = dict(reversed(list(stack.items())))
    return program


@pytest.mark.parametrize("lowering", ["per-body", "flat"])
def test_a_stack_in_reverse_order_still_lowers_to_a_valid_model_equal_to_eager(
        reversed_stack_gpt2, gpt2_model, lowering):
    from tests.onnx_fixtures import GPT2_RULES

    result = rewrite.apply(GPT2_RULES, reversed_stack_gpt2)
    assert [f.id for f in result.tree.flattened] == ["h.0"]
    ids = [grp.id for grp in result.tree.groups()]
    assert len(ids) == len(set(ids)) and "h.0.mlp" in ids, ids
    model = result.to_onnx(lowering=lowering)
    assert_matches_eager(checked_proto(model), gpt2_model)
