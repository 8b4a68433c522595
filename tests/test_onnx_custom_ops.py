"""Custom ops inside functions: a ``torch.library`` op that torch.onnx translates through a
custom translation table (``OnnxOptions.custom_translation_table``) lands in the function of
the block that calls it, also when it becomes a node of another domain (``ai.onnx.ml``), and
every block still shares one function; functions and the model import what they use."""

from __future__ import annotations

import onnxscript
import pytest
import torch
from onnxscript import opset18 as op

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite.errors import InputError
from tools import models
from tests.onnx_fixtures import assert_matches_eager, checked_proto, top_calls


@torch.library.custom_op("rewrite_onnx_tests::erf_gelu", mutates_args=())
def erf_gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x)


@erf_gelu.register_fake
def _(x):
    return torch.empty_like(x)


def erf_gelu_onnx(x):
    """The translation: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    half = op.CastLike(op.Constant(value_float=0.5), x)
    one = op.CastLike(op.Constant(value_float=1.0), x)
    scale = op.CastLike(op.Constant(value_float=0.7071067811865476), x)
    return op.Mul(op.Mul(x, half), op.Add(op.Erf(op.Mul(x, scale)), one))


@torch.library.custom_op("rewrite_onnx_tests::step", mutates_args=())
def step(x: torch.Tensor) -> torch.Tensor:
    return (x > 0).to(x.dtype)


@step.register_fake
def _(x):
    return torch.empty_like(x)


ML = onnxscript.values.Opset("ai.onnx.ml", 3)


def step_onnx(x):
    """The translation: ``ai.onnx.ml`` Binarizer (1 where x > 0)."""
    return ML.Binarizer(x, threshold=0.0)


TABLE = {torch.ops.rewrite_onnx_tests.erf_gelu.default: erf_gelu_onnx,
         torch.ops.rewrite_onnx_tests.step.default: step_onnx}


class GeluBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return erf_gelu(y) + step(y)


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([GeluBlock(), GeluBlock(), GeluBlock()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def stack():
    torch.manual_seed(0)
    triple = (models.perturb(Stack().eval()), (torch.randn(2, 4),), {})
    program = torch.export.export(triple[0], triple[1])
    return triple, rewrite.apply(rewrite.parse_rules("group class *GeluBlock"), program)


def test_custom_op_translated_inside_the_block_function(stack):
    triple, result = stack
    lowering = lower(result, OnnxOptions(custom_translation_table=TABLE))
    assert lowering.path == "per-body" and lowering.warnings == ()  # the table reaches it too
    model = lowering.model
    checked_proto(model)
    assert_matches_eager(model, triple)
    assert top_calls(model) == {"GeluBlock": 3}
    (block,) = model.functions.values()
    assert {("", "Erf"), ("ai.onnx.ml", "Binarizer")} <= {(n.domain, n.op_type) for n in block}
    assert "ai.onnx.ml" in block.opset_imports and "ai.onnx.ml" in model.opset_imports


def test_custom_translation_table_flat_path_equals(stack):
    triple, result = stack
    lowering = lower(result, OnnxOptions(custom_translation_table=TABLE, lowering="flat"))
    assert lowering.path == "flat"
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, triple)
    assert top_calls(lowering.model) == {"GeluBlock": 3}


def test_without_a_translation_torch_is_named_as_the_cause(stack):
    _, result = stack
    with pytest.raises(InputError, match="torch.onnx.export"):
        lower(result)
