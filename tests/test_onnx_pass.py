"""``rewrite.RewritePass`` in an exporter pipeline after ``torch.onnx.export(..., dynamo=True)``.

One random-weight GPT-2 with dynamic batch and sequence is exported once; the pass groups
``onnx_program.model`` in place, and the ONNXProgram then runs and saves the grouped model.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common
import pytest
import torch
from attrs import frozen

import rewrite
from rewrite.errors import GroupingError, RewriteError, RuleError
from tools import models
from tests.onnx_fixtures import GPT2_RULES, checked_proto, run_eager, run_onnx, top_calls

BLOCKS = 3


@frozen
class Pipeline:
    triple: tuple
    program: torch.onnx.ONNXProgram
    flat: ir.Model
    """A copy of the export before the pass."""
    result: ir.passes.PassResult


def _copy(model: ir.Model) -> ir.Model:
    return ir.from_proto(ir.to_proto(model))


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString()


def _inputs() -> tuple:
    return (torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(3)),)


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    triple = models.positional(models.randomized(models.gpt2(n_layer=BLOCKS)))
    model, args, _ = triple
    # min=2: torch 2.9's trace of GPT-2 specializes a batch of 1 (the guard batch != 1)
    batch, seq = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", max=60)
    program = torch.onnx.export(model, (torch.randint(0, 100, (2, 8)),), dynamo=True,
                                dynamic_shapes=({0: batch, 1: seq},), verbose=False)
    flat = _copy(program.model)
    result = rewrite.RewritePass(GPT2_RULES)(program.model)
    return Pipeline(triple, program, flat, result)


def _block_functions(model: ir.Model) -> list[str]:
    return [name for _, name, _ in model.functions if name.startswith("GPT2Block")]


def test_pass_groups_the_program_in_place(pipeline):
    result = pipeline.result
    assert result.modified
    assert result.model is pipeline.program.model
    checked_proto(result.model)
    assert _block_functions(result.model) == ["GPT2Block"]
    assert top_calls(result.model)["GPT2Block"] == BLOCKS
    assert not top_calls(pipeline.flat)


def test_program_runs_the_grouped_model(pipeline):
    args = _inputs()
    got = [t.numpy() for t in pipeline.program(*args)]
    want = run_eager(pipeline.triple, args)
    flat = run_onnx(pipeline.flat, args)
    assert len(got) == len(want) == len(flat)
    for g, w, f in zip(got, want, flat):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(g, f, atol=1e-4, rtol=1e-4)


def test_program_saves_the_grouped_model(pipeline, tmp_path):
    path = tmp_path / "gpt2.onnx"
    pipeline.program.save(str(path))
    saved = ir.load(str(path))
    checked_proto(saved)
    assert top_calls(saved) == top_calls(pipeline.result.model)


def test_second_run_changes_nothing(pipeline, caplog):
    before = _bytes(pipeline.program.model)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        again = rewrite.RewritePass(GPT2_RULES)(pipeline.program.model)
    assert not again.modified
    assert _bytes(again.model) == before
    assert "matches nothing" in caplog.text


def test_functional_pass_leaves_its_input_alone(pipeline):
    flat = _copy(pipeline.flat)
    before = _bytes(flat)
    result = rewrite.RewritePass(GPT2_RULES, in_place=False)(flat)
    assert result.model is not flat
    assert result.modified
    assert _bytes(flat) == before
    assert top_calls(result.model) == top_calls(pipeline.result.model)
    checked_proto(result.model)


def test_pass_in_a_pass_manager(pipeline):
    manager = ir.passes.PassManager([
        rewrite.RewritePass(GPT2_RULES),
        onnx_ir.passes.common.RemoveUnusedNodesPass(),
        onnx_ir.passes.common.RemoveUnusedFunctionsPass(),
    ])
    result = manager(_copy(pipeline.flat))
    assert result.modified
    checked_proto(result.model)
    assert top_calls(result.model) == top_calls(pipeline.result.model)
    np.testing.assert_allclose(run_onnx(result.model, _inputs())[0],
                               run_onnx(pipeline.flat, _inputs())[0], atol=1e-4, rtol=1e-4)


def test_options_reach_the_outliner(pipeline):
    # without recomputing the nodes CSE shares across blocks, block 0 differs from the others
    result = rewrite.RewritePass(GPT2_RULES, recompute=False)(_copy(pipeline.flat))
    checked_proto(result.model)
    assert _block_functions(result.model) == ["GPT2Block", "GPT2Block_1"]


def test_model_without_module_metadata_is_left_alone(pipeline, caplog):
    model = _copy(pipeline.flat)
    onnx_ir.passes.common.ClearMetadataAndDocStringPass()(model)
    before = _bytes(model)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        result = rewrite.RewritePass(GPT2_RULES)(model)
    assert not result.modified
    assert _bytes(result.model) == before
    assert caplog.text.count("no module structure") == 1  # said once, from grouping


# --- user mistakes ------------------------------------------------------------------------------


def test_missing_rules_file_is_a_rule_error(tmp_path):
    with pytest.raises(RuleError, match="missing.rules"):
        rewrite.RewritePass(tmp_path / "missing.rules")


def test_grouping_errors_come_out_of_the_pass(pipeline):
    rules = rewrite.parse_rules('group class *GPT2Block domain "ai.onnx"')
    model = _copy(pipeline.flat)
    before = _bytes(model)
    with pytest.raises(GroupingError, match="reserved"):
        rewrite.RewritePass(rules)(model)
    assert _bytes(model) == before  # checked before anything is outlined


def test_not_an_onnx_ir_model_is_an_input_error(pipeline):
    with pytest.raises(RewriteError, match="cannot read a model of type ModelProto"):
        rewrite.RewritePass(GPT2_RULES)(ir.to_proto(pipeline.flat))


def test_bad_option_is_refused():
    with pytest.raises(ValueError):
        rewrite.RewritePass(GPT2_RULES, constants="inline")


def test_defaults_are_the_backends():
    from rewrite.backends.onnx import OnnxOptions

    assert rewrite.RewritePass(GPT2_RULES).options == OnnxOptions()


def test_in_a_pass_manager_errors_come_wrapped(pipeline):
    rules = rewrite.parse_rules('group class *GPT2Block domain "ai.onnx"')
    manager = ir.passes.PassManager([rewrite.RewritePass(rules)])
    with pytest.raises(ir.passes.PassError) as caught:
        manager(_copy(pipeline.flat))
    causes = []
    error: BaseException | None = caught.value
    while error is not None:
        causes.append(error)
        error = error.__cause__
    assert isinstance(causes[-1], GroupingError)
