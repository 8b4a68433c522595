"""``rewrite.export``: an nn.Module in, a grouped ONNX model out, names as given."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
import pytest
import torch

import rewrite
from tools import models
from tests.onnx_fixtures import checked_proto, run_eager, run_onnx, session, top_calls

LAYERS = 3


@pytest.fixture(scope="module")
def gpt2_exported():
    """GPT-2 with dynamic batch and sequence, exported once for the module."""
    triple = models.positional(models.randomized(models.gpt2(n_layer=LAYERS)))
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=60)
    model = rewrite.export(triple[0], (torch.randint(0, 100, (2, 8)),), rules="gpt2",
                           dynamic_shapes=({0: batch, 1: seq},), input_names=["input_ids"],
                           output_names=["last_hidden_state"])
    return triple, model


def test_gpt2_with_dynamic_batch_and_sequence(gpt2_exported):
    triple, model = gpt2_exported
    checked_proto(model)
    assert [v.name for v in model.graph.inputs] == ["input_ids"]
    assert [v.name for v in model.graph.outputs] == ["last_hidden_state"]
    block_functions = [f for f in model.functions.values() if f.name == "GPT2Block"]
    assert len(block_functions) == 1
    assert top_calls(model)["GPT2Block"] == LAYERS
    sess = session(model)
    assert [o.name for o in sess.get_outputs()] == ["last_hidden_state"]
    for shape in [(1, 5), (3, 11)]:
        ids = torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(shape[1]))
        (got,) = sess.run(None, {"input_ids": ids.numpy()})
        (want,) = run_eager(triple, (ids,))
        assert got.shape == want.shape == (*shape, 32)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_an_output_that_a_function_call_makes_keeps_its_name(tmp_path):
    triple = models.chain(blocks=3)
    out = tmp_path / "chain.onnx"
    model = rewrite.export(triple[0], triple[1], rules=rewrite.parse_rules("group class *Block"),
                           input_names=["x"], output_names=["y"], output=out)
    (y,) = model.graph.outputs
    assert y.name == "y"
    assert y.producer().op_type == "Block"  # the last block's call makes the graph output
    assert top_calls(model)["Block"] == 3
    saved = ir.load(out)
    checked_proto(saved)
    sess = session(saved)
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert [o.name for o in sess.get_outputs()] == ["y"]
    (got,) = sess.run(None, {"x": triple[1][0].numpy()})
    np.testing.assert_allclose(got, run_eager(triple)[0], atol=1e-4, rtol=1e-4)


class _Twice(torch.nn.Module):
    """Returns its input and one value twice: outputs that cannot carry a name alone."""

    def __init__(self):
        super().__init__()
        self.block = models.Block()

    def forward(self, x):
        y = self.block(x)
        return y, x, y


def test_outputs_that_are_inputs_or_repeated_get_their_own_names():
    torch.manual_seed(0)
    module, x = models.perturb(_Twice().eval()), torch.randn(2, 4)
    model = rewrite.export(module, (x,), rules="modularize", input_names=["x"],
                           output_names=["a", "b", "c"])
    assert [v.name for v in model.graph.outputs] == ["a", "b", "c"]
    checked_proto(model)
    got = run_onnx(model, (x,))
    want = run_eager((module, (x,), {}))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_annotate_tags_survive(staged_model):
    rules = rewrite.parse_rules('split by stage order "encode", "decode"')
    model = rewrite.export(staged_model[0], staged_model[1], rules=rules)
    assert list(top_calls(model)) == ["encode", "decode"]
    checked_proto(model)
    np.testing.assert_allclose(run_onnx(model, staged_model[1])[0], run_eager(staged_model)[0],
                               atol=1e-4, rtol=1e-4)


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_a_torch_export_failure_is_an_input_error(tmp_path):
    out = tmp_path / "never.onnx"
    with pytest.raises(rewrite.InputError) as e:
        rewrite.export(_DataDependent(), (torch.randn(2),), rules="modularize", output=out)
    assert str(e.value).startswith("torch.export could not export _DataDependent: ")
    assert "\n" not in str(e.value)
    assert e.value.__cause__ is not None
    assert not out.exists()


def test_bad_arguments_fail_before_exporting(tmp_path):
    triple = models.chain(blocks=1)
    with pytest.raises(rewrite.RuleError):
        rewrite.export(triple[0], triple[1], rules=tmp_path / "missing.rules")
    with pytest.raises(rewrite.InputError, match="does not exist"):
        rewrite.export(triple[0], triple[1], rules="modularize", output=tmp_path / "no" / "x.onnx")
    with pytest.raises(rewrite.InputError, match="2 input_names given, but the graph has 1"):
        rewrite.export(triple[0], triple[1], rules="modularize", input_names=["a", "b"])
    with pytest.raises(rewrite.InputError, match="both an input and an output"):
        rewrite.export(triple[0], triple[1], rules="modularize", input_names=["a"],
                       output_names=["a"])


def test_export_is_public():
    assert "export" in rewrite.__all__
    assert callable(rewrite.export)


def _dims(values) -> list[list]:
    return [[d.value if isinstance(d, ir.SymbolicDim) else d for d in v.shape] for v in values]


def test_dynamic_dimensions_carry_the_names_of_their_dims(gpt2_exported):
    _, model = gpt2_exported
    assert _dims(model.graph.inputs) == [["batch", "seq"]]
    assert _dims(model.graph.outputs) == [["batch", "seq", 32]]
    inside = {d for f in model.functions.values() for node in f for v in node.outputs
              if v.shape is not None for d in _dims([v])[0] if isinstance(d, str)}
    assert {"batch", "seq"} <= inside, inside  # in expressions too (seq*batch), no s0 left
    assert not [d for d in inside if re.search(r"(?<!\w)s\d+(?!\w)", d)], inside


@pytest.mark.slow  # torch.onnx.export too, for the comparison
def test_dimension_names_are_those_torch_onnx_export_gives(gpt2_exported):
    (module, _, _), model = gpt2_exported
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=60)
    try:
        reference = torch.onnx.export(module, (torch.randint(0, 100, (2, 8)),), dynamo=True,
                                      dynamic_shapes=({0: batch, 1: seq},), verbose=False)
    except Exception as e:  # torch 2.9's torch.onnx guards batch != 1 here: its own limit
        pytest.skip(f"torch.onnx.export fails on this model with torch {torch.__version__}: "
                    f"{type(e).__name__}")
    assert _dims(model.graph.inputs) == _dims(reference.model.graph.inputs)
    assert _dims(model.graph.outputs) == _dims(reference.model.graph.outputs)


def test_a_dim_without_a_name_keeps_its_symbol():
    module, args, _ = models.chain(blocks=2)
    model = rewrite.export(module, args, rules=rewrite.parse_rules("group class *Block"),
                           dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    (first,) = _dims(model.graph.inputs)
    assert isinstance(first[0], str) and first[0].startswith("s"), first


def test_a_violated_shape_constraint_is_said_in_one_line_with_its_condition():
    """torch.export's "Constraints violated" names the dynamic size and the condition the
    model's code needs (read from the lines under its first one)."""
    from rewrite.exporting.module import violated

    message = ("Constraints violated (sequence_length)! For more information, run with "
               "TORCH_LOGS=\"+dynamic\".\n  - Not all values of sequence_length = "
               "L['input_ids'].size()[1] in the specified range satisfy the generated guard "
               "(L['input_ids'].size()[1]*min(64, 64*L['input_ids'].size()[1])) == "
               "(64*L['input_ids'].size()[1]).\n\nThe error above occurred when calling")
    said = violated(message)
    assert said.startswith("the model's code holds for some values of the dynamic "
                           "sequence_length only ((sequence_length*min(64, 64*sequence_length))"
                           " == (64*sequence_length))")
    assert "\n" not in said
    assert violated("Constraints violated (x)! For more information") == ""
