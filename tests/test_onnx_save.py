"""Writing ONNX: the CLI on a .pt2, external data, atomic writes, progress, unusual .pt2s."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from rich.console import Console

import rewrite
from rewrite.backends.onnx import save_onnx
from rewrite.backends.onnx import save as save_module
from rewrite.cli.steps import Steps
from rewrite.errors import InputError
from tools import models
from tests.onnx_fixtures import (
    GPT2_RULES,
    MODULARIZE,
    ROOT,
    assert_matches_eager,
    run_eager,
    run_onnx,
    top_calls,
)


def _load_checked(path) -> ir.Model:
    onnx.checker.check_model(str(path), full_check=True)  # by path: external data included
    return ir.load(str(path))


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_apply_on_pt2_writes_a_valid_grouped_model(run_cli, gpt2_pt2, gpt2_model, tmp_path):
    out = tmp_path / "gpt2.onnx"
    run = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", out)
    assert run.code == 0, run
    model = _load_checked(out)
    assert top_calls(model)["GPT2Block"] == 2
    assert_matches_eager(str(out), gpt2_model)
    assert not (tmp_path / "gpt2.onnx.data").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.onnx"]  # no temp files left


@pytest.mark.parametrize("flags", [("--external-data", "always"), ("--weights-chunk", "64KB"),
                                   ("--external-data", "always", "--weights-chunk", "64KB")])
def test_every_way_to_write_external_data_gives_a_model_onnxruntime_runs(
        run_cli, gpt2_pt2, gpt2_model, tmp_path, flags):
    """The weights go to the data file, the shapes of the Reshapes stay in the model: else
    onnxruntime refuses it (``Cannot parse data from external tensors``)."""
    out = tmp_path / "gpt2.onnx"
    run = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", out, *flags)
    assert run.code == 0, run
    data = sorted(p.name for p in tmp_path.iterdir() if p.name != "gpt2.onnx")
    assert data and all(not name.startswith(".") for name in data), data
    assert len(data) > 1 if "--weights-chunk" in flags else data == ["gpt2.onnx.data"]
    _load_checked(out)
    assert_matches_eager(str(out), gpt2_model)


def test_weights_above_the_threshold_give_a_model_onnxruntime_runs(gpt2_pt2, gpt2_model,
                                                                   tmp_path):
    """``auto`` above a (small) threshold."""
    out = tmp_path / "gpt2.onnx"
    save_onnx(rewrite.apply(GPT2_RULES, gpt2_pt2), out, external_data_threshold=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.onnx", "gpt2.onnx.data"]
    _load_checked(out)
    assert_matches_eager(str(out), gpt2_model)


def test_cli_apply_refuses_to_write_over_its_input(run_cli, gpt2_pt2):
    before = gpt2_pt2.read_bytes()
    run = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", gpt2_pt2)
    assert run.code == 2, run
    assert gpt2_pt2.read_bytes() == before


@pytest.mark.slow  # a fresh process
def test_transformers_pt2_with_return_dict_in_a_fresh_process(tmp_path):
    # torch.export.load needs the output class (a transformers ModelOutput) registered for
    # pytree deserialization: a fresh process that has not imported transformers must still
    # read the file and lower it
    triple = models.gpt2()
    model, args, _ = triple
    program = torch.export.export(model, args, kwargs={"return_dict": True, "use_cache": False})
    pt2 = tmp_path / "dict.pt2"
    torch.export.save(program, str(pt2))
    out = tmp_path / "dict.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "rewrite", "apply", str(GPT2_RULES), str(pt2), "-o", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (hidden,) = run_onnx(str(out), args)
    np.testing.assert_allclose(hidden, run_eager(triple)[0], atol=1e-4, rtol=1e-4)


# --- external data ----------------------------------------------------------------------------


class _Wide(torch.nn.Module):
    """A 2 KiB weight, a 128-byte bias and a Reshape's shape (16 bytes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 32)

    def forward(self, x):
        return self.lin(x).reshape(4, -1)


@pytest.mark.parametrize("options", [{"external_data_threshold": 32},
                                     {"external_data_threshold": 0},
                                     {"weights_chunk": 1000}])
def test_external_data_holds_the_weights_and_small_constants_stay_inline(tmp_path, options):
    """``--external-data always`` and chunks: the weights go out, the shapes onnxruntime's
    shape inference reads stay in the model (else it refuses the model)."""
    triple = (_Wide().eval(), (torch.randn(2, 16),), {})
    program = torch.export.export(triple[0], triple[1])
    out = tmp_path / "model.onnx"
    save_onnx(rewrite.apply(MODULARIZE, program), out, **options)
    proto = onnx.load(str(out), load_external_data=False)
    where = {t.name: t.data_location == onnx.TensorProto.EXTERNAL
             for t in proto.graph.initializer}
    assert where["lin.weight"] and not where["lin.bias"], where
    assert sum(where.values()) == 1, where
    _load_checked(out)
    assert_matches_eager(str(out), triple)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_small_models_stay_in_one_file(shared_program, tmp_path):
    result = rewrite.apply(MODULARIZE, shared_program)
    save_onnx(result, tmp_path / "model.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_default_threshold_keeps_memory_flat():
    """Embedded weights are serialized in memory (about twice their size): above 256 MiB
    they go to external data, copied file to file (and ONNX files cannot exceed 2 GiB)."""
    from rewrite.backends.onnx import OnnxOptions

    assert OnnxOptions().external_data_threshold == 2**28


# --- never a partial file ---------------------------------------------------------------------


def _failing_save(model, path, *args, **kwargs):
    with open(path, "wb") as f:
        f.write(b"partial")
    external = kwargs.get("external_data")
    if external:
        with open(os.path.join(os.path.dirname(path), external), "wb") as f:
            f.write(b"partial")
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("threshold", [64, 2**31])
def test_a_failed_write_leaves_the_old_file_and_no_debris(shared_program, tmp_path, monkeypatch,
                                                          threshold):
    result = rewrite.apply(MODULARIZE, shared_program)
    out = tmp_path / "model.onnx"
    out.write_bytes(b"old")
    monkeypatch.setattr(save_module.ir, "save", _failing_save)
    monkeypatch.setattr(save_module, "save_embedded", _failing_save)  # weights embedded
    with pytest.raises(InputError, match="No space left"):
        save_onnx(result, out, external_data_threshold=threshold)
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


# --- progress -----------------------------------------------------------------------------------


def test_progress_goes_to_the_console_and_is_silent_without_one(shared_program, tmp_path,
                                                                capsys):
    result = rewrite.apply(MODULARIZE, shared_program)
    buffer = io.StringIO()
    save_onnx(result, tmp_path / "a.onnx", progress=Steps(Console(file=buffer, width=200)))
    text = buffer.getvalue()
    assert "torch.onnx" in text and "outlining" in text and "functions" in text
    capsys.readouterr()
    save_onnx(result, tmp_path / "b.onnx")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
