"""Weights written while torch.export runs (``rewrite.export`` of a module whose weights lie
in files, as ``from_pretrained`` maps them): what a user sees.

- the output equals the one written after lowering, weight for weight (the data file's
  order may differ), runs in onnxruntime equal to eager and passes the full checker;
- torch.export failing while the weights are being written leaves the output folder as it
  was (the old pair, byte for byte; no staging folder);
- a process killed while torch.export runs, its weights already written, leaves the old pair
  whole; the next run leaves exactly the new pair.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
import torch

import rewrite
from rewrite.errors import InputError
from tests.onnx_fixtures import assert_matches_eager
from tests.test_mapped_weights import Recorder, _checkpoint, _load

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file mappings, SIGKILL")

ROOT = Path(__file__).resolve().parents[1]
IDS = torch.arange(6).unsqueeze(0)


def _export(model, out: Path, **options) -> Recorder:
    progress = Recorder()
    rewrite.export(model, (IDS,), {"use_cache": False}, rules="llama", output=out,
                   external_data_threshold=0, progress=progress, **options)
    return progress


def _weights(path: Path) -> dict[str, bytes]:
    """Each initializer's bytes, read by onnx from wherever the model says they are."""
    proto = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in proto.graph.initializer}


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture()
def model(tmp_path):
    return _load(_checkpoint(tmp_path / "ckpt", torch.float32), torch.float32)


def test_weights_written_while_exporting_make_the_same_model(model, tmp_path):
    early, late = tmp_path / "early" / "model.onnx", tmp_path / "late" / "model.onnx"
    early.parent.mkdir(), late.parent.mkdir()
    assert "written while exporting" in _export(model, early).notes[-1]
    # chunked data is written after lowering, as before: the same weights, the same graph
    assert "written while exporting" not in _export(model, late, weights_chunk=2**30).notes[-1]
    assert _weights(early) == _weights(late) and len(_weights(early)) > 10
    early_proto, late_proto = (onnx.load(str(p), load_external_data=False)
                               for p in (early, late))
    assert early_proto.graph.node == late_proto.graph.node
    assert early_proto.functions == late_proto.functions
    assert _listing(early.parent) == ["model.onnx", "model.onnx.data"]
    onnx.checker.check_model(str(early), full_check=True)
    assert_matches_eager(str(early), (model, (IDS,), {"use_cache": False}))


def test_export_failing_while_weights_are_written_leaves_the_output_as_it_was(model, tmp_path):
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    _export(model, out)
    before = {name: (out.parent / name).read_bytes() for name in _listing(out.parent)}
    with pytest.raises(InputError, match="torch.export could not export"):
        rewrite.export(model, ("not a tensor",), {"use_cache": False}, rules="llama",
                       output=out, external_data_threshold=0)
    assert {name: (out.parent / name).read_bytes() for name in _listing(out.parent)} == before


KILLED_WRITER = """
import sys, time, torch
from pathlib import Path
import rewrite
from tests.test_mapped_weights import _load
model = _load(Path(sys.argv[1]), torch.float32)
def export(*args, **kwargs):  # the weights are being written: report, then hang
    print("exporting", flush=True)
    time.sleep(600)
torch.export.export = export
rewrite.export(model, (torch.arange(6).unsqueeze(0),), {"use_cache": False}, rules="llama",
               output=sys.argv[2], external_data_threshold=0)
"""


@pytest.mark.slow  # kills processes at every step
def test_a_process_killed_while_exporting_leaves_the_old_pair(model, tmp_path):
    folder = tmp_path / "ckpt"
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    _export(model, out)
    before = {name: (out.parent / name).read_bytes() for name in _listing(out.parent)}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(folder), str(out)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "exporting"
        in_data = sum(p.nbytes for p in model.parameters() if p.nbytes > 1024)  # none aligned
        staged = _staged_data(out, in_data)  # the weights written while torch.export runs
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert staged.stat().st_size == in_data
    assert {name: (out.parent / name).read_bytes() for name in _listing(out.parent)
            if not name.startswith(".")} == before
    assert_matches_eager(str(out), (model, (IDS,), {"use_cache": False}))
    _export(model, out)  # the next run cleans what the killed one left
    assert _listing(out.parent) == ["model.onnx", "model.onnx.data"]


def _staged_data(out: Path, size: int, timeout: float = 60.0) -> Path:
    """The data file in the output's staging folder, once ``size`` bytes are written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for folder in out.parent.glob(f".{out.name}.*"):
            data = folder / (out.name + ".data")
            if data.exists() and data.stat().st_size >= size:
                return data
        time.sleep(0.05)
    raise AssertionError(f"no early data in {_listing(out.parent)}")
