"""FX backend, split: one submodule per tag component, called in order, like split_by_tags."""

from __future__ import annotations

import pytest
import torch

import rewrite
from rewrite.backends.fx import LoweredModule
from tools import models
from tests.test_fx_modularize import assert_same_outputs

SPLIT = "rules/split_by_tags.rules"


def calls(gm: torch.fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_split_by_annotated_stage(staged_model, staged_program):
    model, args, _ = staged_model
    gm = rewrite.apply(SPLIT, staged_program).to_fx()
    assert [name for name, _ in gm.named_children()] == ["encode", "decode"]
    assert calls(gm) == ["encode", "decode"]
    assert [type(m).__name__ for _, m in gm.named_children()] == ["encode", "decode"]
    assert_same_outputs(gm(*args), model(*args))
    # like split_by_tags, each component holds the weights it uses, under their full names
    assert gm.get_parameter("encode.enc.lin.weight") is staged_program.state_dict["enc.lin.weight"]
    assert {k.split(".")[0] for k in gm.state_dict()} == {"encode", "decode"}
    # the decode component reads what encode made: data flows in order
    decode = next(n for n in gm.graph.nodes if n.target == "decode")
    assert [a.target for a in decode.args] == ["encode"]


def test_tag_region_that_appears_twice():
    """A, B, A: split_by_tags fails (one component per tag is a cycle); here: a, b, a_1."""
    model, args, _ = models.alternating()
    program = models.export((model, args, {}), preserve_meta=True)
    result = rewrite.apply(SPLIT, program)
    gm = result.to_fx()
    assert calls(gm) == ["a", "b", "a_1"]
    assert [g.tag_value for g in result.tree.root.children] == ["a", "b", "a"]
    assert_same_outputs(gm(*args), model(*args))


def test_order_against_the_data_flow_is_an_error(staged_program):
    rules = rewrite.parse_rules('split by stage order "decode", "encode"\n')
    with pytest.raises(rewrite.GroupingError, match="contradicts the data flow") as info:
        rewrite.apply(rules, staged_program)
    assert info.value.nodes  # names the nodes on the offending edge


def test_explicit_order_that_agrees(staged_model, staged_program):
    model, args, _ = staged_model
    rules = rewrite.parse_rules('split by stage order "encode", "decode"\n')
    gm = rewrite.apply(rules, staged_program).to_fx()
    assert calls(gm) == ["encode", "decode"]
    assert_same_outputs(gm(*args), model(*args))


def test_tags_from_rules_need_no_annotations(staged_model):
    model, args, _ = staged_model
    program = models.export(staged_model)  # no preserve_node_meta: no `stage` in meta
    rules = rewrite.parse_rules(
        'tag path enc with stage = "encode"\n'
        'tag path mid or path dec with stage = "decode"\n'
        "split by stage\n"
    )
    gm = rewrite.apply(rules, program).to_fx()
    assert calls(gm) == ["encode", "decode"]
    assert_same_outputs(gm(*args), model(*args))


def test_node_tag_set_by_hand_on_a_traced_module(shared_model):
    model, args, _ = shared_model
    traced = torch.fx.symbolic_trace(model)
    back = False
    for node in traced.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        back = back or node.target == "layers.1.lin"
        node.tag = "back" if back else "front"
    rules = rewrite.parse_rules('split by tag order "front", "back"\n')
    gm = rewrite.apply(rules, traced).to_fx()
    assert calls(gm) == ["front", "back"]
    assert_same_outputs(gm(*args), model(*args))


def test_components_with_module_groups_inside(staged_model, staged_program):
    model, args, _ = staged_model
    rules = rewrite.parse_rules("split by stage\ngroup path **\n")
    gm = rewrite.apply(rules, staged_program).to_fx()
    assert calls(gm) == ["encode", "decode"]
    assert calls(gm.decode) == ["mid", "dec"]
    assert isinstance(gm.decode.mid, LoweredModule) and type(gm.decode.mid).__name__ == "Sub"
    assert gm.decode.mid.lin.weight is gm.get_parameter("decode.mid.lin.weight")
    assert_same_outputs(gm(*args), model(*args))
