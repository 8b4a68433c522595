"""A model whose code holds only where a condition on a dynamic size holds, which
torch.export cannot prove (Aria's experts): exported again with the condition deferred to run
time, and kept only where the condition holds for every length the export accepts; where it
does not, or cannot be proved, still refused, nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rewrite
from rewrite.exporting.deferred import CHECKED, deferrable
from tests.onnx_fixtures import checked_proto, run_onnx


class _Branch(torch.nn.Module):
    """A projection taken where ``n * min(cap, scale * n) == other(n)`` at the input's length
    ``n``, the input as it is elsewhere: a branch on the length, in the model's own code."""

    def __init__(self, cap: int, scale: int, square: bool = False) -> None:
        super().__init__()
        self.cap, self.scale, self.square = cap, scale, square
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        other = n * n if self.square else self.cap * n
        if n * min(self.cap, self.scale * n) == other:
            return self.proj(x)
        return x


def _export(model: torch.nn.Module, output, progress=None) -> object:
    return rewrite.export(model, (torch.randn(1, 5, 8),), rules="modularize",
                          dynamic_shapes=({1: torch.export.Dim("seq")},), output=output,
                          progress=progress)


def test_a_condition_true_for_every_length_is_deferred_and_the_model_equals_eager(tmp_path):
    """Aria's condition, ``seq * min(64, 64 * seq) == 64 * seq``: true for every length,
    which torch.export cannot prove; the model converts and equals eager at every length,
    one token to beyond the lengths checked one by one."""
    from tests.test_checkpoint_export import Recorder

    model = _Branch(64, 64).eval()
    progress = Recorder()
    exported = _export(model, tmp_path / "m.onnx", progress)
    checked_proto(exported)
    said = " ".join(progress.text.split())
    try:  # torch 2.15 proves this one itself: then nothing is deferred, nor said
        torch.export.export(model, (torch.randn(1, 5, 8),),
                            dynamic_shapes=({1: torch.export.Dim("seq")},))
        refused = False
    except torch._dynamo.exc.UserError:
        refused = True
    assert ("torch.export: the model's code holds for some values of the dynamic seq only"
            in said and "deferred to run time and proved by rewrite for every length"
            in said) == refused, said
    for length in (1, 2, 5, 64, CHECKED + 300):
        x = torch.randn(1, length, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        (got,) = run_onnx(exported, (x,))
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_a_condition_false_for_some_lengths_is_still_refused(tmp_path):
    """``seq * min(4, seq) == 4 * seq`` holds from 4 tokens on (the example's 5), false for
    1 to 3: deferred to run time, the ONNX model (no runtime asserts) would project shorter
    inputs too, which eager does not; refused in one line naming the first length where the
    condition fails, nothing written."""
    with pytest.raises(rewrite.InputError) as refused:
        _export(_Branch(4, 1), tmp_path / "never.onnx")
    said = str(refused.value)
    assert said.startswith("torch.export could not export _Branch: the model's code holds "
                           "for some values of the dynamic seq only"), said
    assert said.endswith("deferred to run time, Eq(seq*Min(4, seq), 4*seq) is false at "
                         "seq = 1"), said
    assert "\n" not in said
    assert not (tmp_path / "never.onnx").exists()


def test_a_condition_true_only_up_to_some_length_is_not_proved_and_refused(tmp_path):
    """``seq * min(2000, seq) == seq * seq`` holds up to 2000 tokens only: true at every
    length checked one by one, and sympy cannot prove it beyond (it is false from 2001):
    refused, nothing written."""
    with pytest.raises(rewrite.InputError, match=rf"cannot be proved for seq > {CHECKED} "
                       r"\(true up to it\)$"):
        _export(_Branch(2000, 1, square=True), tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


@pytest.mark.parametrize("lines, expected", [
    (["  - Not all values of seq = L['x'].size()[1] in the specified range satisfy the "
      "generated guard Eq(Mod(seq, 2), 0)."], True),
    (["  - Not all values of seq = L['x'].size()[1] in the specified range seq <= 511 "
      "satisfy the generated guard Ne(Mod(2*seq - 1, seq), 0).",
      "  - Not all values of past = L['p'].size()[2] in the specified range satisfy the "
      "generated guard past <= 7"], True),
    (["  - Not all values of seq = L['x'].size()[1] in the specified range satisfy the "
      "generated guard Eq(Mod(seq, 2), 0).",
      "  - The values of past = L['p'].size()[2] must always be related to the values of "
      "seq = L['x'].size()[1] by past = seq."], False),
    (["  - You marked seq as dynamic but your code specialized it to be a constant (5)."],
     False),
    ([], False),
])
def test_only_conditions_on_one_size_each_are_deferred(lines, expected):
    """The retry is made where torch.export's refusal lists conditions on one size each; a
    relation between sizes or a size made constant is refused as torch.export says."""
    message = "\n".join(["Constraints violated (seq)! For more information, run with "
                         "TORCH_LOGS=\"+dynamic\".", *lines, "Suggested fixes:",
                         "  seq = Dim('seq', max=511)"])
    assert deferrable(message) is expected
