"""A model whose code holds only where a condition on a dynamic size holds, which
torch.export cannot prove (Aria's experts): exported again with the condition deferred to run
time, and kept only where the condition holds for every length the export accepts; where it
does not, or cannot be proved, still refused, nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rewrite
from rewrite.exporting.deferred import CHECKED, CONSTANTS, deferrable
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
    _equal_to_eager_at(model, exported, (1, 2, 5, 64, CHECKED + 300))


def test_a_condition_false_for_some_lengths_is_still_refused(tmp_path):
    """``seq * min(4, seq) == 4 * seq`` holds from 4 tokens on (the example's 5), false for
    1 to 3: deferred to run time, the ONNX model (no runtime asserts) would project shorter
    inputs too, which eager does not; refused in one line naming the first length where the
    condition fails, nothing written."""
    said = _refusal(_Branch(4, 1), tmp_path)
    assert said.startswith("torch.export could not export _Branch: the model's code holds "
                           "for some values of the dynamic seq only"), said
    assert said.endswith("deferred to run time, Eq(seq*Min(4, seq), 4*seq) is false at "
                         "seq = 1"), said
    assert "\n" not in said


def test_a_condition_true_only_up_to_some_length_bounds_the_length(tmp_path):
    """``seq * min(2000, seq) == seq * seq`` holds up to 2000 tokens only: evaluated on up
    to its constant (sympy cannot prove it past the lengths checked), false at 2001: the
    model is exported for ``seq <= 2000``, says so, and equals eager there."""
    from rewrite.exporting.bounds import recorded
    from tests.test_checkpoint_export import Recorder

    model = _Branch(2000, 1, square=True).eval()
    progress = Recorder()
    exported = _export(model, tmp_path / "m.onnx", progress)
    assert "its code holds for seq <= 2000 only (deferred to run time, Eq(seq*Min(2000, seq), " \
        "seq**2) is false at seq = 2001, true below;" in " ".join(progress.text.split())
    assert recorded(exported) == {"seq": 2000}
    _equal_to_eager_at(model, exported, (2, 2000))


def test_a_condition_past_the_constants_evaluated_is_not_proved_and_refused(tmp_path):
    """The same with a constant beyond :data:`CONSTANTS`: true at every length checked one
    by one, which sympy cannot prove beyond: refused, nothing written."""
    with pytest.raises(rewrite.InputError, match=rf"cannot be proved for seq > {CHECKED} "
                       r"\(true up to it\)$"):
        _export(_Branch(CONSTANTS + 1, 1, square=True), tmp_path / "never.onnx")
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


@pytest.mark.parametrize("lines, expected", [
    (["  - Not all values of seq = L['x'].size()[1] in the specified range satisfy the "
      "generated guard (((-1) + 4*L['x'].size()[1]) // L['x'].size()[1]) == 3."
      "Specializations unexpectedly required (seq)! For more information, run with "
      "TORCH_LOGS=\"+dynamic\".",
      "  - solving the guards generated for seq = L['x'].size()[1] resulted in a specialized "
      "value of 5."], True),
    (["  - solving the guards generated for seq = L['x'].size()[1] resulted in a specialized "
      "value of 5."], False),
])
def test_a_value_torch_solved_a_condition_to_is_no_reason_not_to_defer(lines, expected):
    """ProphetNet's refusal: the condition, and the length torch.export's solver of it would
    fix (it cannot solve ``(4*seq - 1) // seq == 3``): the retry is made; a fixed length
    alone is refused as torch.export says."""
    message = "\n".join(["Constraints violated (seq)!", *lines, "Suggested fixes:",
                         "  seq = 5"])
    assert deferrable(message) is expected


class _Table(torch.nn.Module):
    """OpenAI-GPT's shape: a table of 16 positions (torch.export bounds the length to 16)
    and a branch on the length taken below 16 only (its mask slice, contiguous at 16 alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        y = x + self.table[:n]
        return self.proj(y) if n != 16 else y


def test_a_condition_false_at_the_bound_only_lowers_the_bound(tmp_path):
    """torch.export bounds the length to 16 and then refuses ``seq != 16``: the condition
    holds one below, so the model is exported for ``seq <= 15``, says so, and equals eager
    at every length it takes (at 16 eager takes the other branch: not in the model)."""
    from rewrite.exporting.bounds import recorded
    from tests.test_checkpoint_export import Recorder

    model = _Table().eval()
    progress = Recorder()
    exported = _export(model, tmp_path / "m.onnx", progress)
    checked_proto(exported)
    said = " ".join(progress.text.split())
    assert ("_Table: its code holds for seq <= 15 only (deferred to run time, Ne(seq, 16) is "
            "false at seq = 16, true below;") in said, said
    assert recorded(exported) == {"seq": 15}
    _equal_to_eager_at(model, exported, (1, 2, 15))


class _TopK(torch.nn.Module):
    """DeepSeek-V3.2's indexer: the top ``min(2048, n)`` of ``n``, a condition
    (``Min(2048, seq) <= seq``) sympy decides only past 2048."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.topk(x, min(2048, x.shape[1]), dim=1).values)


def test_a_condition_on_a_min_of_a_constant_is_proved_past_the_constant(tmp_path):
    """``Min(2048, seq) <= seq``, true for every length: evaluated one by one up to its
    constant, then proved past it; the model converts and equals eager on both sides."""
    model = _TopK().eval()
    exported = rewrite.export(model, (torch.randn(1, 5, 8),), rules="modularize",
                              dynamic_shapes=({1: torch.export.Dim("seq", min=2)},),
                              output=tmp_path / "m.onnx")
    _equal_to_eager_at(model, exported, (2, 5, 2100))


class _Chunks(torch.nn.Module):
    """ProphetNet's streams: three of a length concatenated, chunked in three (torch's
    decomposition of ``chunk`` guards ``(4*seq - 1) // seq == 3``, true for every length)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = torch.cat([x, 2 * x, 3 * x], dim=1).chunk(3, dim=1)
        return self.proj(a + b * c)


def test_a_guard_torch_export_keeps_when_deferring_is_refused_saying_so(tmp_path):
    """The retry is made, and torch.export refuses it the same way (a guard of its own
    decomposition, not deferred): refused in one line saying it is torch.export's limit,
    the condition without torch's solver's words after it, nothing written."""
    said = _refusal(_Chunks(), tmp_path)
    assert said == ("torch.export could not export _Chunks: the model's code holds for some "
                    "values of the dynamic seq only ((((-1) + 4*seq) // seq) == 3): a shape "
                    "condition torch.export cannot prove for every length, nor defer to run "
                    "time (torch.export keeps it as a guard: a limit of torch.export)"), said


def test_a_condition_that_cannot_be_evaluated_at_a_length_is_refused(tmp_path):
    """``Ne(Mod(1, Min(2048, seq)), 0)`` at ``seq = 0`` (a length the export accepts): a
    division by zero in the proof is a refusal naming the length, not a crash."""
    with pytest.raises(rewrite.InputError, match=r"cannot be evaluated at seq = 0 "
                       r"\(ZeroDivisionError: Modulo by zero\)$"):
        _export(_TopK(), tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_a_length_made_a_constant_is_said_in_one_line():
    """CPM-Ant's ``torch.tensor(list(range(seqlen - prompt_length)))``: torch.export's
    "specialized it to be a constant" is said as the model's code fixing the length."""
    from rewrite.exporting.module import violated

    message = ("Constraints violated (sequence_length)!\n  - You marked sequence_length as "
               "dynamic but your code specialized it to be a constant (3). If you're using "
               "mark_dynamic, either remove it or use maybe_mark_dynamic.\nSuggested fixes:\n"
               "  sequence_length = 3")
    assert violated(message).startswith("the model's code makes the dynamic sequence_length "
                                        "a constant (3, the example's): ")


class _OnData(torch.nn.Module):
    """A branch on the number of positive inputs (BLT's entropy patching: torch.distributions
    validating its logits): a value computed from the data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x > 0).sum().item() == 1:
            return x
        return 2 * x


def test_a_branch_on_the_data_is_said_in_one_line_naming_where(tmp_path):
    """torch.export's "Could not guard on data-dependent expression": one line saying the
    model's code branches on the data, the expression and the model's line, what would
    help; nothing written."""
    said = _refusal(_OnData(), tmp_path)
    assert said == ("torch.export could not export _OnData: the model's code branches on a "
                    "value computed from the input data (Eq(u0, 1)), which torch.export cannot "
                    "trace for every input: torch.cond or torch._check in the model's code "
                    "would help"), said


def test_the_models_line_is_named_where_torch_export_gives_it():
    """BLT's refusal: torch.export names the call that raised (transformers' file and line)."""
    from rewrite.exporting.module import data_dependent

    message = ("Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1))."
               "  (Size-like symbols: none)\n\nThe following call raised this error:\n  File "
               "\"/venv/site-packages/transformers/models/blt/modeling_blt.py\", line 915, in "
               "forward\n")
    assert data_dependent(message).startswith(
        "the model's code branches on a value computed from the input data (Eq(u0, 1), "
        "modeling_blt.py:915 in forward), which")


def _equal_to_eager_at(model: torch.nn.Module, exported, lengths: tuple[int, ...]) -> None:
    """``exported`` in onnxruntime equals ``model`` eagerly at each of ``lengths`` (a random
    ``[1, length, 8]`` input)."""
    for length in lengths:
        x = torch.randn(1, length, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        (got,) = run_onnx(exported, (x,))
        np.testing.assert_allclose(got, expected, atol=1e-5)


def _refusal(model: torch.nn.Module, tmp_path) -> str:
    """What the export of ``model`` is refused with (an :class:`InputError`), nothing
    written."""
    with pytest.raises(rewrite.InputError) as refused:
        _export(model, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()
    return str(refused.value)
