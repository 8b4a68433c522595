"""A model and its external data are published as one: whatever fails, and whenever, the
output folder holds the old pair or the new pair, never a mix, and no debris.

The two pairs here come from two models with different weights, so a model beside the
other's data computes something else: every check runs the pair in onnxruntime against
eager PyTorch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

import rewrite
from rewrite.files import outputs
from rewrite.backends.onnx import save_onnx
from rewrite.errors import InputError
from tests.onnx_fixtures import assert_matches_eager

ROOT = Path(__file__).resolve().parents[1]
MODULARIZE = ROOT / "rules" / "modularize.rules"


class Net(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _triple(seed: int):
    return Net(seed).eval(), (torch.randn(2, 16),), {}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Two models (different weights) as .pt2 files and their eager triples."""
    folder = tmp_path_factory.mktemp("pairs")
    made = []
    for seed in (1, 2):
        triple = _triple(seed)
        path = folder / f"net{seed}.pt2"
        torch.export.save(torch.export.export(triple[0], triple[1]), str(path))
        made.append((path, triple))
    return made


def _write(pt2: Path, out: Path) -> None:
    save_onnx(rewrite.apply(MODULARIZE, pt2), out, external_data_threshold=0)


def _is_pair_of(out: Path, triple, *, checker: bool = True) -> bool:
    """Whether ``out`` loads in onnxruntime and computes what ``triple`` does (and passes
    the full checker: not while a killed publish left its data with two names)."""
    if checker:
        onnx.checker.check_model(str(out), full_check=True)
    try:
        assert_matches_eager(str(out), triple)
    except AssertionError:
        return False
    return True


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_replacing_a_pair_gives_the_new_pair(pairs, tmp_path):
    (old, old_triple), (new, new_triple) = pairs
    out = tmp_path / "model.onnx"
    _write(old, out)
    assert _is_pair_of(out, old_triple)
    _write(new, out)
    assert _is_pair_of(out, new_triple)
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]


def _failing_replace(fail_at: int):
    real = os.replace
    calls = {"n": 0}

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(5, "Input/output error")
        return real(src, dst)
    return replace, calls


def _publish_steps(pairs, tmp_path) -> int:
    """How many renames publishing a pair over a pair takes."""
    (old, _), (new, _) = pairs
    out = tmp_path / "count" / "model.onnx"
    out.parent.mkdir()
    _write(old, out)
    replace, calls = _failing_replace(fail_at=-1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(outputs.os, "replace", replace)
        _write(new, out)
    return calls["n"]


def test_a_failure_at_any_step_leaves_a_whole_pair_and_the_next_run_cleans(pairs, tmp_path):
    """An error before the commit keeps the old pair (no debris); after it, the new pair
    stands (its staging folder kept while the model reads it); the next run cleans up."""
    (old, old_triple), (new, new_triple) = pairs
    steps = _publish_steps(pairs, tmp_path)
    assert steps >= 3  # first model in, data linked, final model in
    found = []
    for fail_at in range(1, steps + 1):
        folder = tmp_path / f"fail{fail_at}"
        folder.mkdir()
        out = folder / "model.onnx"
        _write(old, out)
        replace, _ = _failing_replace(fail_at)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(outputs.os, "replace", replace)
            with pytest.raises(InputError, match="Input/output error"):
                _write(new, out)
        found.append("new" if _is_pair_of(out, new_triple, checker=False) else "old")
        if found[-1] == "old":
            assert _listing(folder) == ["model.onnx", "model.onnx.data"], fail_at
            assert _is_pair_of(out, old_triple), fail_at
        assert _visible(folder) == ["model.onnx", "model.onnx.data"], fail_at
        _write(old, out)
        assert _listing(folder) == ["model.onnx", "model.onnx.data"], fail_at
        assert _is_pair_of(out, old_triple), fail_at
    assert found[0] == "old" and found[-1] == "new", found


def _visible(folder: Path) -> list[str]:
    return [name for name in _listing(folder) if not name.startswith(".")]


def test_a_stale_data_file_goes_when_the_new_model_embeds_its_weights(pairs, tmp_path):
    (old, _), (new, new_triple) = pairs
    out = tmp_path / "model.onnx"
    _write(old, out)
    save_onnx(rewrite.apply(MODULARIZE, new), out)  # small: embedded
    assert _listing(tmp_path) == ["model.onnx"]
    assert _is_pair_of(out, new_triple)


def test_stale_chunks_go_when_the_new_model_does_not_use_them(pairs, tmp_path):
    (old, _), (new, new_triple) = pairs
    out = tmp_path / "model.onnx"
    save_onnx(rewrite.apply(MODULARIZE, old), out, weights_chunk=2048)
    chunks = [name for name in _listing(tmp_path) if name != "model.onnx"]
    assert len(chunks) == 2 and "model.onnx.data" not in chunks, chunks
    _write(new, out)
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert _is_pair_of(out, new_triple)
    save_onnx(rewrite.apply(MODULARIZE, old), out, weights_chunk=2048)
    assert [name for name in _listing(tmp_path) if name != "model.onnx"] == chunks


def test_an_unrelated_data_file_beside_a_new_output_is_replaced(pairs, tmp_path):
    (_, _), (new, new_triple) = pairs
    out = tmp_path / "model.onnx"
    (tmp_path / "model.onnx.data").write_bytes(b"left over from something else")
    _write(new, out)
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert _is_pair_of(out, new_triple)


@pytest.mark.slow  # two processes at once
def test_two_runs_writing_the_same_output_leave_one_whole_pair(pairs, tmp_path):
    """Two processes at once: the result is one run's model with that run's data."""
    out = tmp_path / "model.onnx"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "rewrite", "apply", str(MODULARIZE), str(pt2), "-o", str(out),
         "--external-data", "always", "-q"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for pt2, _ in pairs]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert any(_is_pair_of(out, triple) for _, triple in pairs)
