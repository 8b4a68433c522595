"""A static export's per-layer check at its twin's sizes (issue 41, rewrite/exporting/twin.py).

The program of a static export, extended from its first layers, has fixed sizes (a whole chunk
over the whole context); the same call traced at one row of 2 tokens over 8 slots, its twin,
is checked in its stead when the two programs are alike but for their sizes: once for every
chunk length. A program wired wrong is caught there and traced whole; a program not alike
its twin is checked itself. Every export here is then fed a prompt in chunks and decode steps
in onnxruntime, equal to eager (1e-4).
"""

from __future__ import annotations

import pytest
import torch

import rewrite
from rewrite.exporting import once
from rewrite.exporting.twin import alike
from tests import checkpoints
from tests.test_checkpoint_export import Recorder
from tests.test_static_sizes import CHUNK, CONTEXT, _assert_chunks_then_decode_equal_eager
from tests.test_trace_layers_once import wire_added_layers_stale

TWIN = "checked at its twin's sizes, its program alike"
WHOLE = ("torch.export traces every layer: the program of the first layers, extended, does "
         "not give the model's outputs")


def _static_export(tmp_path) -> str:
    """A 5-layer Llama exported with ``--static batch=1,seq=4,seq=1``, its chunks and decode
    steps equal to eager (checked here); what the export said."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint", layers=5)
    progress = Recorder()
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    rewrite.export(folder, output=out, cache="static", context=CONTEXT,
                   static={"batch": 1, "seq": [CHUNK, 1]}, progress=progress)
    _assert_chunks_then_decode_equal_eager(folder, out, CONTEXT)
    return progress.text


def _counted(monkeypatch) -> list:
    """The examples :func:`once.check_bodies` is run on, from now on."""
    seen: list = []
    check = once.check_bodies

    def counted(model, layers, program, example, *args, **kwargs):
        seen.append(example[0].shape)
        return check(model, layers, program, example, *args, **kwargs)

    monkeypatch.setattr(once, "check_bodies", counted)
    return seen


def test_a_static_program_is_checked_once_at_its_twins_sizes(tmp_path, monkeypatch):
    seen = _counted(monkeypatch)
    text = _static_export(tmp_path)
    assert text.count(TWIN) == 2, text  # both chunk lengths
    assert seen == [torch.Size([1, 2])], seen  # one check, one row of 2 tokens


@pytest.mark.slow
def test_a_static_program_wired_wrong_is_caught_at_its_twins_sizes(tmp_path, monkeypatch):
    wire_added_layers_stale(monkeypatch)
    text = _static_export(tmp_path)
    assert text.count(WHOLE) == 2 and TWIN not in text, text


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True], ids=["right", "wired wrong"])
def test_a_program_unlike_its_twin_is_checked_itself(stale, tmp_path, monkeypatch):
    monkeypatch.setattr(once, "alike", lambda a, b: False)
    if stale:
        wire_added_layers_stale(monkeypatch)
    seen = _counted(monkeypatch)
    text = _static_export(tmp_path)
    assert TWIN not in text and text.count(WHOLE) == (2 if stale else 0), text
    assert torch.Size([1, CHUNK]) in seen and torch.Size([1, 1]) in seen, seen


class _Branching(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.linear(x)) + x
        return y * 2 if x.shape[0] > 3 else y  # code that reads a size


def test_programs_alike_but_for_their_sizes():
    module = _Branching()
    small, other, large = (torch.export.export(module, (torch.randn(n, 8),))
                           for n in (2, 3, 5))
    assert alike(small, other)
    assert not alike(small, large)  # the branch taken at 5 rows: another graph
    add = next(n for n in other.graph.nodes if n.target == torch.ops.aten.add.Tensor)
    add.args = (add.args[0], add.args[0])  # rewired: relu + relu
    assert not alike(small, other)
