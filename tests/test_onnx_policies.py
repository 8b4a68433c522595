"""ONNX backend policies: constants, shared nodes the optimizer made, later optimization,
ONNX files as input, split components, and errors a user can make."""

from __future__ import annotations

import onnx_ir as ir
import onnxscript.optimizer
import pytest
import torch

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite.errors import GroupingError, InputError
from tools import models
from tests.onnx_fixtures import (
    GPT2_RULES,
    Called,
    assert_matches_eager,
    callees,
    checked_proto,
    function_names,
    top_calls,
)

BLOCK_RULES = """
group class *GPT2Block
group class *GPT2Attention
group class *GPT2MLP
"""


# --- constants -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def factors():
    triple = models.two_factors()
    return triple, rewrite.apply(rewrite.parse_rules("group class *Scaled"), models.export(triple))


def test_modules_differing_in_a_constant_get_separate_functions(factors):
    triple, result = factors
    model = lower(result, OnnxOptions(constants="embed")).model
    checked_proto(model)
    assert_matches_eager(model, triple)
    calls = {n.name: n.op_type for n in model.graph if n.domain == "pkg.tools"}
    assert calls == {"a": "Scaled", "b": "Scaled_1", "c": "Scaled"}
    for function in model.functions.values():
        assert any(n.op_type == "Constant" for n in function)


def test_constants_as_inputs_share_one_function(factors):
    triple, result = factors
    model = lower(result, OnnxOptions(constants="input")).model
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"Scaled": 3}
    (function,) = model.functions.values()
    assert not any(n.op_type == "Constant" for n in function)


def test_unknown_constant_policy_is_refused():
    with pytest.raises(ValueError):
        OnnxOptions(constants="inline")


# --- nodes the optimizer shares across blocks --------------------------------------------------


@pytest.fixture(scope="module")
def dynamic_gpt2():
    model, _, kwargs = models.gpt2(n_layer=3)
    wrapped = Called(model, kwargs).eval()
    ids = torch.randint(0, 100, (2, 8))
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=60)
    program = torch.export.export(wrapped, (ids,), dynamic_shapes=({0: batch, 1: seq},))
    return (wrapped, (ids,), {}), program


@pytest.mark.slow
def test_blocks_sharing_optimizer_nodes_still_share_one_function(dynamic_gpt2):
    # with dynamic shapes the optimizer's CSE over torch.onnx.export's flat model makes
    # blocks 1 and 2 read shape and mask values computed inside block 0; they are recomputed
    # per block. Per body, each block's nodes are its own: nothing to recompute
    triple, program = dynamic_gpt2
    result = rewrite.apply(rewrite.parse_rules(BLOCK_RULES), program)
    for lowering in ("flat", "per-body"):
        lowered = lower(result, OnnxOptions(lowering=lowering))
        model = lowered.model
        checked_proto(model)
        assert (lowered.outlined.recomputed > 0) == (lowering == "flat")
        assert top_calls(model) == {"GPT2Block": 3}
        assert function_names(model) == {"GPT2Block": 1, "GPT2Attention": 1, "GPT2MLP": 1}
        assert_matches_eager(model, triple, (torch.randint(0, 100, (3, 11)),))


@pytest.mark.slow
def test_without_recomputing_the_first_block_differs(dynamic_gpt2):
    triple, program = dynamic_gpt2
    lowering = lower(rewrite.apply(rewrite.parse_rules(BLOCK_RULES), program),
                     OnnxOptions(recompute=False, lowering="flat"))
    model = lowering.model
    checked_proto(model)
    assert len([f for f in model.functions if f[1].startswith("GPT2Block")]) == 2
    assert_matches_eager(model, triple, (torch.randint(0, 100, (3, 11)),))


# --- optimizing afterwards ---------------------------------------------------------------------


def test_optimizing_the_output_keeps_the_functions(gpt2_lowered, gpt2_model):
    result, _ = gpt2_lowered
    model = result.to_onnx()
    before = top_calls(model)
    onnxscript.optimizer.optimize_ir(model, inline=False)
    checked_proto(model)
    assert top_calls(model) == before
    assert callees(model, "GPT2Block") == {"GPT2Attention": 1, "GPT2MLP": 1}
    assert_matches_eager(model, gpt2_model)


# --- an ONNX file as input (torch.onnx metadata, no @N) ---------------------------------------


def _flat_onnx(program, path, optimize=True):
    torch.onnx.export(program, dynamo=True, optimize=optimize, verbose=False).save(str(path))
    return path


def test_flat_gpt2_onnx_file_is_grouped_like_the_pt2(gpt2_program, gpt2_model, tmp_path):
    path = _flat_onnx(gpt2_program, tmp_path / "flat.onnx")
    model = rewrite.apply(GPT2_RULES, path).to_onnx()
    checked_proto(model)
    assert_matches_eager(model, gpt2_model)
    assert top_calls(model)["GPT2Block"] == 2
    assert callees(model, "GPT2Block") == {"GPT2Attention": 1, "GPT2MLP": 1}


def test_onnx_input_model_is_not_changed(gpt2_program, tmp_path):
    flat = torch.onnx.export(gpt2_program, dynamo=True, verbose=False).model
    before = ir.to_proto(flat).SerializeToString()
    out = rewrite.apply(GPT2_RULES, flat).to_onnx()
    assert ir.to_proto(flat).SerializeToString() == before
    assert top_calls(out)["GPT2Block"] == 2


def test_calls_apart_are_separate_calls_in_an_onnx_file(tmp_path):
    triple = models.shared_apart()
    path = _flat_onnx(models.export(triple), tmp_path / "apart.onnx", optimize=False)
    result = rewrite.apply(rewrite.parse_rules("group path shared or path mid"), path)
    ids = [g.id for g in result.tree.groups()]
    assert ids == ["shared", "mid", "shared@1"]
    model = result.to_onnx()
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"Sub_1": 3}  # Sub: an ONNX operator's name


def test_back_to_back_calls_merge_in_an_onnx_file(shared_program, shared_model, tmp_path):
    # documented limit: without @N, shared(shared(x)) is one run, so one call
    path = _flat_onnx(shared_program, tmp_path / "shared.onnx")
    result = rewrite.apply(rewrite.parse_rules("group path shared"), path)
    assert [g.id for g in result.tree.groups()] == ["shared"]
    model = result.to_onnx()
    checked_proto(model)
    assert_matches_eager(model, shared_model)


# --- split components -------------------------------------------------------------------------


def test_split_components_become_functions(staged_program, staged_model):
    result = rewrite.apply(rewrite.parse_rules("split by stage"), staged_program)
    model = result.to_onnx()
    checked_proto(model)
    assert_matches_eager(model, staged_model)
    assert top_calls(model) == {"encode": 1, "decode": 1}
    assert {f[0] for f in model.functions} == {"pkg.rewrite"}


class _Four(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s0, self.s1, self.s2, self.s3 = (models.Sub() for _ in range(4))

    def forward(self, x):
        return self.s3(self.s2(self.s1(self.s0(x))))


def test_split_runs_never_take_the_name_of_another_value():
    """Runs a, b, a, a_1: the second run of a is named a_2, a_1 is the value's own."""
    torch.manual_seed(0)
    triple = (models.perturb(_Four().eval()), (torch.randn(2, 4),), {})
    rules = rewrite.parse_rules(
        'tag path s0 or path s2 with stage = "a"\n'
        'tag path s1 with stage = "b"\n'
        'tag path s3 with stage = "a_1"\n'
        "split by stage\n")
    result = rewrite.apply(rules, models.export(triple))
    components = result.tree.root.children
    assert [(c.id, c.tag_value) for c in components] == [
        ("a", "a"), ("b", "b"), ("a_2", "a"), ("a_1", "a_1")]
    model = result.to_onnx()
    checked_proto(model)
    assert_matches_eager(model, triple)
    groups = [n.metadata_props["pkg.rewrite.group"] for n in model.graph
              if "pkg.rewrite.group" in n.metadata_props]
    assert groups == ["a", "b", "a_2", "a_1"]
    gm = result.to_fx()
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == [
        "a", "b", "a_2", "a_1"]


# --- user mistakes ------------------------------------------------------------------------------


def test_reserved_function_domain_is_a_grouping_error(shared_program):
    result = rewrite.apply(rewrite.parse_rules('group class *Sub domain "ai.onnx"'), shared_program)
    with pytest.raises(GroupingError, match="reserved"):
        result.to_onnx()


def test_graph_module_without_export_is_an_input_error(shared_model):
    model, args, _ = shared_model
    gm = torch.fx.symbolic_trace(model)
    result = rewrite.apply(rewrite.parse_rules("group path shared"), gm)
    with pytest.raises(InputError, match="ExportedProgram"):
        result.to_onnx()


# --- control flow ------------------------------------------------------------------------------


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.other = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return torch.cond(y.sum() > 0, lambda t: self.other(t) * 2, lambda t: t - 1, (y,))


class _TwoBranchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = _Branchy()
        self.b = _Branchy()

    def forward(self, x):
        return self.b(self.a(x))


def test_subgraphs_read_weights_through_function_inputs():
    torch.manual_seed(0)
    model, x = models.perturb(_TwoBranchy().eval()), torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    onnx_model = rewrite.apply(rewrite.parse_rules("group class *_Branchy"), program).to_onnx()
    checked_proto(onnx_model)
    assert top_calls(onnx_model) == {"_Branchy": 2}
    (function,) = onnx_model.functions.values()
    assert "If" in [n.op_type for n in function]
    # the If branch reads other.weight from the enclosing scope: a function input
    assert {"other.weight", "other.bias"} <= {v.name for v in function.inputs}
    inputs = [10 * x, -10 * x]
    with torch.no_grad():  # the first If takes each branch once
        assert {bool(model.a.lin(i).sum() > 0) for i in inputs} == {True, False}
    for i in inputs:
        assert_matches_eager(onnx_model, (model, (i,), {}))
