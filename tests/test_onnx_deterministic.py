"""The ONNX output is the same bytes whatever Python's hash seed (reproducible builds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools import models

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import hashlib, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
import onnx_ir as ir, torch, rewrite
program = torch.export.load({pt2!r})
model = rewrite.apply("rules/modularize.rules", program).to_onnx()
print(hashlib.sha256(ir.serde.serialize_model(model).SerializeToString()).hexdigest())
"""


def _digest(pt2: Path, seed: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    code = _SCRIPT.format(root=str(ROOT), pt2=str(pt2))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # processes under several hash seeds
def test_same_bytes_under_different_hash_seeds(tmp_path):
    pt2 = tmp_path / "shared.pt2"
    torch.export.save(models.export(models.shared_and_list()), str(pt2))
    first, second = _digest(pt2, 0), _digest(pt2, 1)
    assert len(first) == 64
    assert first == second


_MODEL_SOURCE = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) + x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
"""


def _exported_from(folder: Path, monkeypatch) -> bytes:
    """The model of ``folder/netcode.py`` (imported from there) exported: its bytes."""
    import importlib

    import onnx_ir as ir

    import rewrite

    folder.mkdir()
    (folder / "netcode.py").write_text(_MODEL_SOURCE)
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(folder))
        patch.delitem(sys.modules, "netcode", raising=False)
        net = importlib.import_module("netcode").Net()
        torch.manual_seed(0)
        with torch.no_grad():
            for p in net.parameters():
                p.normal_()
        model = rewrite.export(net, (torch.randn(2, 8),), rules="rules/modularize.rules")
    traces = [node.metadata_props.get("pkg.torch.onnx.stack_trace", "")
              for graph in (model.graph, *model.functions.values()) for node in graph]
    assert any('File "netcode.py"' in trace for trace in traces)
    assert not any(str(folder) in trace for trace in traces)
    return ir.serde.serialize_model(model).SerializeToString()


def test_the_same_code_elsewhere_exports_the_same_bytes(tmp_path, monkeypatch):
    """The nodes' stack traces name source files relative to their import root, so a model's
    code checked out (or installed) in another folder exports the same file."""
    monkeypatch.chdir(ROOT)
    first = _exported_from(tmp_path / "one", monkeypatch)
    second = _exported_from(tmp_path / "checkout-two", monkeypatch)
    assert first == second


def test_a_file_outside_every_import_root_keeps_its_path():
    from rewrite.backends.onnx.finishing._portable import portable

    trace = 'File "/srv/a/site-packages/x/y.py", line 3, in f\n  File "/elsewhere/z.py", line 1'
    assert portable(trace, ("/srv/a/site-packages/", "/srv/")) == \
        'File "x/y.py", line 3, in f\n  File "/elsewhere/z.py", line 1'
