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
