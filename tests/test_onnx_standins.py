"""Repeated calls are not materialized (issue 12): per body, only the first call is inlined.

From the user's side: rules text + model -> ONNX. The other calls of a body become calls of
the function made for the first one, never inlined (``Lowering.inlined``); the result is the
one the flat path gives (functions, nesting, call counts, metadata), passes the full checker
and equals eager. A block that must not share (a rule that groups only ``h.1.attn``, a tag on
one block) gets its own function or body; a call whose stand-in does not fit is inlined
(today's behaviour), with the same result.
"""

from __future__ import annotations

import ast

import pytest

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite.backends.onnx import _standins as standins
from tools import models
from tests.onnx_fixtures import GPT2_RULES, LLAMA_RULES, assert_matches_eager, checked_proto
from tests.test_onnx_perbody import _both, _same_result

NO_SHARED_ATTN = """
group class *GPT2Block
group path h.1.attn
group class *GPT2MLP
flat class *Dropout
on cycle flatten
"""

ONE_TAGGED = GPT2_RULES.read_text() + """
tag path h.1.** with stage = "special"
"""


@pytest.fixture(scope="module")
def gpt2_3():
    triple = models.gpt2(n_layer=3)
    return triple, models.export(triple)


def _function_calls(lowering) -> dict[str, int]:
    return {fid[1]: n for fid, n in lowering.outlined.calls.items()}


def _lowered_like_flat(rules, gpt2_3):
    """Both lowerings of the 3-block GPT-2; the per-body one checked against the flat one
    (same result, same calls), the full checker and eager."""
    triple, program = gpt2_3
    fast, flat = _both(rewrite.parse_rules(rules), program)
    _same_result(fast, flat)
    assert _function_calls(fast) == _function_calls(flat)
    checked_proto(fast.model)
    assert_matches_eager(fast.model, triple)
    return fast


@pytest.mark.parametrize("rules, name", [(GPT2_RULES, "gpt2"), (LLAMA_RULES, "llama")])
def test_repeated_blocks_are_not_materialized(rules, name, request):
    program = request.getfixturevalue(f"{name}_program")
    triple = request.getfixturevalue(f"{name}_model")
    fast, flat = _both(rules, program)
    assert fast.inlined == 1  # the first block only; the second stood in
    _same_result(fast, flat)
    assert _function_calls(fast) == _function_calls(flat)
    assert fast.outlined.function_of == flat.outlined.function_of
    checked_proto(fast.model)
    assert_matches_eager(fast.model, triple)


def test_a_block_with_two_outputs_stands_in_with_its_outputs_in_order():
    """Every output of a stand-in is wired to the reader of the matching output."""
    triple = models.pair_chain()
    fast, flat = _both(rewrite.parse_rules("group class Pair"), models.export(triple))
    assert fast.inlined == 1  # blocks 2 and 3 stood in
    _same_result(fast, flat)
    checked_proto(fast.model)
    assert_matches_eager(fast.model, triple)
    assert_matches_eager(flat.model, triple)


@pytest.mark.slow
def test_gpt2_calls_keep_their_own_metadata(gpt2_3):
    triple, program = gpt2_3
    fast, flat = _both(GPT2_RULES, program)
    assert fast.inlined == 1
    assert _function_calls(fast)["GPT2Block"] == 3
    assert _function_calls(fast)["GPT2Attention"] == 3

    def calls(model):
        return [(n.name, n.op_type, dict(n.metadata_props)) for n in model.graph
                if n.domain.startswith("pkg.")]

    assert calls(fast.model) == calls(flat.model)
    block = {n.name: n for n in fast.model.graph}["h.2"]
    assert block.metadata_props["namespace"].endswith("/h.2: transformers.models.gpt2."
                                                      "modeling_gpt2.GPT2Block")
    assert "gpt2.rules:" in block.metadata_props["pkg.rewrite.rule"]
    inside = fast.model.functions[("pkg.transformers", "GPT2Block", "")]
    scopes = [ast.literal_eval(n.metadata_props["pkg.torch.onnx.name_scopes"])
              for n in inside if "pkg.torch.onnx.name_scopes" in n.metadata_props]
    assert scopes and all(s[1] == "h.0" for s in scopes)  # the first call's, as before
    assert not any(n.domain == standins.DOMAIN for n in fast.model.graph)


@pytest.mark.slow
def test_a_block_grouped_differently_gets_its_own_function(gpt2_3):
    fast = _lowered_like_flat(NO_SHARED_ATTN, gpt2_3)
    blocks = {gid: fid[1] for gid, fid in fast.outlined.function_of.items()
              if fid is not None and gid.count("/") == 0 and gid.startswith("h.")}
    assert blocks["h.0"] == blocks["h.2"] != blocks["h.1"]
    assert fast.inlined == 1  # h.0 (h.2 stands in); h.1 repeats nothing: not made a call


def test_a_tagged_block_is_its_own_body(gpt2_3):
    fast = _lowered_like_flat(ONE_TAGGED, gpt2_3)
    assert _function_calls(fast)["GPT2Block"] == 3  # the tag changes no function
    assert fast.inlined == 1  # h.0 (h.2 stands in); h.1 is lowered apart, not as a call


def _refuse_one(original, refused: list):
    """``original`` refusing the first stand-in it sees (as if it did not fit)."""

    def refuse(self, *args):
        if not refused:
            refused.append(True)
            return False
        return original(self, *args)

    return refuse


@pytest.mark.slow
def test_a_stand_in_that_does_not_fit_is_inlined(gpt2_3, monkeypatch):
    """The outliner finds a stand-in it cannot call: the lowering runs again with that call
    inlined, and the result is the same."""
    from rewrite.backends.onnx.outlining._membership import Membership

    triple, program = gpt2_3
    refused: list = []
    monkeypatch.setattr(Membership, "only_member", _refuse_one(Membership.only_member, refused))
    fast, flat = _both(GPT2_RULES, program)
    assert refused and fast.inlined == 2
    _same_result(fast, flat)
    assert fast.outlined.function_of == flat.outlined.function_of
    assert_matches_eager(fast.model, triple)


def test_a_stand_in_whose_groups_differ_is_inlined(gpt2_3, monkeypatch):
    triple, program = gpt2_3
    seen: list = []
    original = standins._match

    def match(*args):
        if not seen:
            seen.append(True)
            return None
        return original(*args)

    monkeypatch.setattr(standins, "_match", match)
    fast, flat = _both(GPT2_RULES, program)
    assert seen and fast.inlined == 2
    _same_result(fast, flat)
    assert_matches_eager(fast.model, triple)


def test_input_constants_inline_every_call(gpt2_3):
    """Under ``constants="input"`` (hoisted constants, which stand-ins cannot copy) every
    call is inlined, as before."""
    triple, program = gpt2_3
    result = rewrite.apply(GPT2_RULES, program)
    lowering = lower(result, OnnxOptions(constants="input", lowering="per-body"))
    assert lowering.inlined == 3
    assert _function_calls(lowering)["GPT2Block"] == 3
    assert_matches_eager(lowering.model, triple)


SIZED = """
group class *GPT2Block
group depth == 2 and size >= 40
flat class *Dropout
on cycle flatten
"""


@pytest.mark.parametrize("text", [GPT2_RULES.read_text(), SIZED])
def test_grouping_sees_a_stand_in_as_the_nodes_it_stands_for(text, gpt2_3):
    """The ONNX tree read with stand-ins is the tree of the graph with every call inlined:
    the same groups, sizes (``size`` selectors) and names."""
    from rewrite.backends.onnx.lowering._perbody import DecomposedProgram
    from rewrite.backends.onnx.lowering._regroup import regroup_with

    _, program = gpt2_3
    rules = rewrite.parse_rules(text)
    result = rewrite.apply(rules, program)
    lowering = DecomposedProgram(program, result.tree)

    def tree(stand_ins: bool):
        lowered = lowering.translate(stand_ins=stand_ins)
        assert bool(lowered.stand_ins) == stand_ins
        grouped, warnings = regroup_with(rules, result.tree, lowered.model, lowered.resolver,
                                         lowered.expansions)
        return {g.id: (g.size, g.function_name, g.domain, g.origin) for g in grouped.groups()}, \
            [w.message for w in warnings]

    standing, inlined = tree(True), tree(False)
    assert standing == inlined
    ids = set(standing[0])
    assert {"h.0/h.0.attn", "h.2/h.2.attn"} <= ids  # 91 ONNX nodes each
    assert ("h.2/h.2.mlp" in ids) == (SIZED not in text)  # 34: too small for SIZED


def test_a_size_rule_gives_the_functions_of_the_flat_path(gpt2_3):
    fast = _lowered_like_flat(SIZED, gpt2_3)
    assert fast.inlined == 1
    assert _function_calls(fast)["GPT2Attention"] == 3 and "GPT2MLP" not in _function_calls(fast)
