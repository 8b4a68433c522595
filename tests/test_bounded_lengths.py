"""A model whose code holds up to some length only (a position table as long as its context):
exported within the bounds torch.export suggests, and the user told which."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

import rewrite
from rewrite.exporting.bounds import bounds
from tests.onnx_fixtures import checked_proto, run_onnx
from tests.test_checkpoint_export import Recorder
from tools.coverage import write_checkpoint


class _Positions(torch.nn.Module):
    """Adds a learned position table of 12 rows; longer inputs grow the table (another path
    in the model's code, as XGLM's sinusoidal positions do)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(12, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = self.table
        if x.shape[1] > table.shape[0]:
            table = torch.cat([table, table.new_zeros(x.shape[1] - table.shape[0], 8)])
        return self.proj(x + table[: x.shape[1]])


def test_a_model_bounded_in_length_is_exported_within_the_bound_and_says_so(tmp_path):
    model = _Positions().eval()
    progress = Recorder()
    seq = torch.export.Dim("seq")
    exported = rewrite.export(model, (torch.randn(1, 5, 8),), dynamic_shapes=({1: seq},),
                              rules="modularize", output=tmp_path / "m.onnx",
                              progress=progress)
    assert "_Positions: its code holds for seq <= 12 only" in progress.text
    checked_proto(exported)
    written = onnx.load(str(tmp_path / "m.onnx"))
    assert {p.key: p.value for p in written.metadata_props}["rewrite.bounded_sizes"] == "seq<=12"
    for length in (1, 7, 12):
        x = torch.randn(1, length, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        (got,) = run_onnx(exported, (x,))
        np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.slow  # a tiny XGLM checkpoint exported
def test_xglm_is_exported_within_its_position_table_and_genai_told_its_context(tmp_path,
                                                                                run_cli):
    folder = tmp_path / "xglm"
    assert write_checkpoint("xglm", folder) is None
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    r = run_cli("export", folder, "-o", out)
    assert r.code == 0, r.err
    said = r.out + r.err
    assert ("XGLMForCausalLM: its code holds for sequence_length <= 126, past_sequence_length "
            "<= 126 only") in said
    assert "verified against eager in onnxruntime" in said
    config = json.loads((out.parent / "genai_config.json").read_text())
    table = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    assert config["model"]["context_length"] == config["search"]["max_length"] == 126 < table


def test_a_shape_condition_that_is_not_a_bound_is_still_refused(tmp_path):
    class Even(torch.nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], -1, 2).sum(-1)

    with pytest.raises(rewrite.InputError, match="torch.export could not export Even"):
        rewrite.export(Even(), (torch.randn(1, 6),), rules="modularize",
                       dynamic_shapes=({1: torch.export.Dim("seq")},),
                       output=tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


@pytest.mark.parametrize("fixes, expected", [
    ("  seq = Dim('seq', max=126)\n  past = Dim('past', max=126)\nThe error above", 
     {"seq": 126, "past": 126}),
    ("  seq = Dim('seq', min=2, max=2046)\n", {"seq": 2046}),
    ("  seq = Dim('seq', min=16, max=64)\n", {}),
    ("  seq = 6\n", {}),
    ("  seq = Dim('seq', max=8)\n  past = seq + 1\n", {}),
])
def test_only_upper_bounds_are_taken_from_torch_exports_suggestions(fixes, expected):
    message = "Constraints violated (seq)! ...\n  - Not all values ...\nSuggested fixes:\n" + fixes
    assert bounds(message) == expected
    assert bounds("Constraints violated (seq)! no suggestion") == {}
