"""Scalars as function attributes: blocks that differ only in an eps or a scale share one
function (constant policy ``attribute``, the default), like export_modules_as_functions."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from tools import models
from tests.onnx_fixtures import (
    MODULARIZE,
    assert_matches_eager,
    checked_proto,
    function_names,
    top_calls,
)

BLOCKS = "group class *NormBlock"


@pytest.fixture(scope="module")
def settings():
    triple = models.settings()
    return triple, models.export(triple)


def _lowered(program, rules, **options) -> ir.Model:
    model = lower(rewrite.apply(rules, program), OnnxOptions(**options)).model
    checked_proto(model)
    return model


def _block(model: ir.Model) -> ir.Function:
    (function,) = [f for f in model.functions.values() if f.name.startswith("NormBlock")]
    return function


def test_blocks_differing_in_eps_and_scale_share_one_function(settings):
    triple, program = settings
    model = _lowered(program, rewrite.parse_rules(BLOCKS))
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NormBlock": 4}
    block = _block(model)
    assert set(block.attributes) == {"epsilon", "mul"}
    refs = {a.ref_attr_name for n in block for a in n.attributes.values() if a.is_ref()}
    assert refs == {"epsilon", "mul"}
    passed = [(n.attributes["epsilon"].value, n.attributes["mul"].value)
              for n in model.graph if n.op_type == "NormBlock"]
    np.testing.assert_allclose(passed, [(1e-5, 0.5), (1e-6, 0.5), (1e-5, 0.25), (1e-3, 2.0)],
                               rtol=1e-6)


def test_nested_functions_pass_the_attribute_down(settings):
    # modularize: the LayerNorm is a function of its own inside the block function; its eps
    # is an attribute the block passes on from its own attribute
    triple, program = settings
    model = _lowered(program, MODULARIZE)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NormBlock": 4}
    assert function_names(model)["NormBlock"] == 1
    (norm,) = [f for f in model.functions.values() if f.name == "LayerNorm"]
    assert set(norm.attributes) == {"epsilon"}
    (call,) = [n for n in _block(model) if n.op_type == "LayerNorm"]
    assert call.attributes["epsilon"].ref_attr_name == "epsilon"


def test_only_values_that_differ_are_lifted(settings):
    triple, program = settings
    rules = rewrite.parse_rules("group class *NormBlock and path blocks.[0,2]")
    model = _lowered(program, rules)  # eps is equal in blocks 0 and 2, the scale is not
    assert_matches_eager(model, triple)
    assert set(_block(model).attributes) == {"mul"}


def test_separate_functions_policy(settings):
    triple, program = settings
    model = _lowered(program, rewrite.parse_rules(BLOCKS), constants="embed")
    assert_matches_eager(model, triple)
    assert len([f for f in model.functions.values() if f.name.startswith("NormBlock")]) == 4
    assert not any(f.attributes for f in model.functions.values())


def test_input_policy_shares_one_function(settings):
    # the scale is a constant: an input under this policy; eps is an attribute of the
    # LayerNormalization op, which cannot be an input: it becomes a function attribute
    triple, program = settings
    model = _lowered(program, rewrite.parse_rules(BLOCKS), constants="input")
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NormBlock": 4}
    block = _block(model)
    assert set(block.attributes) == {"epsilon"}
    assert not any(n.op_type == "Constant" for n in block)


def test_attributes_without_optimizing(settings):
    triple, program = settings
    model = _lowered(program, rewrite.parse_rules(BLOCKS), optimize=False)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NormBlock": 4}


# --- on the command line ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def settings_pt2(settings, tmp_path_factory):
    import torch

    path = tmp_path_factory.mktemp("settings") / "settings.pt2"
    torch.export.save(settings[1], str(path))
    rules = path.parent / "blocks.rules"
    rules.write_text(BLOCKS + "\n")
    return path, rules


@pytest.mark.parametrize(("flags", "functions"), [
    ((), 1), (("--constants", "embed"), 4), (("--constants", "input"), 1),
    (("--no-optimize",), 1),
])
def test_apply_policies_on_the_command_line(run_cli, settings, settings_pt2, tmp_path, flags,
                                            functions):
    pt2, rules = settings_pt2
    out = tmp_path / "out.onnx"
    r = run_cli("apply", rules, pt2, "-o", out, *flags)
    assert r.code == 0, r.err
    model = ir.load(str(out))
    checked_proto(model)
    assert_matches_eager(model, settings[0])
    assert len([f for f in model.functions.values() if f.name.startswith("NormBlock")]) == \
        functions


def test_unknown_policy_is_a_usage_error(run_cli, settings_pt2, tmp_path):
    pt2, rules = settings_pt2
    r = run_cli("apply", rules, pt2, "-o", tmp_path / "out.onnx", "--constants", "inline")
    assert r.code == 2 and "invalid choice: 'inline'" in r.err
    assert not (tmp_path / "out.onnx").exists()


def test_command_line_offers_every_policy():
    from rewrite.backends.onnx.options import CONSTANT_POLICIES
    from rewrite.cli import args

    assert args.CONSTANT_POLICIES == CONSTANT_POLICIES


def test_rewrite_pass_in_place_lifts_scalars_too(settings, tmp_path):
    # RewritePass on torch.onnx's own (optimized) export, in place, like the functional path
    import torch

    triple, program = settings
    path = tmp_path / "flat.onnx"
    torch.onnx.export(program, dynamo=True, verbose=False).save(str(path))
    model = ir.load(str(path))
    result = rewrite.RewritePass(rewrite.parse_rules(BLOCKS), in_place=True)(model)
    assert result.model is model
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"NormBlock": 4}
    assert "epsilon" in _block(model).attributes


@pytest.mark.parametrize("lowering", ["per-body", "flat"])
def test_a_scale_of_one_still_shares_the_block_function(lowering):
    """Four blocks that differ in eps and a residual scale 0.5, 0.25, 0.125, 1.0 give one
    EpsBlock function under modularize: the scalar variants are merged before optimizing (a
    function attribute cannot be folded), so the multiply by 1.0 is not removed from the
    fourth block alone; each call passes its values."""
    triple = models.eps_blocks()
    model = _lowered(models.export(triple), MODULARIZE, lowering=lowering)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"EpsBlock": 4}
    assert [name for name in function_names(model) if name.startswith("EpsBlock")] == \
        ["EpsBlock"]
    passed = [(n.attributes["epsilon"].value, n.attributes["mul"].value)
              for n in model.graph if n.op_type == "EpsBlock"]
    np.testing.assert_allclose(passed, [(1e-5, 0.5), (1e-6, 0.25), (1e-5, 0.125), (1e-3, 1.0)],
                               rtol=1e-6)
