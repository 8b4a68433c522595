"""Weights of a module loaded from safetensors are copied file to file by ``rewrite.export``
(issue 31): what a user of ``from_pretrained`` + ``rewrite.export(..., output=...)`` sees.

- bf16 / fp16 / fp32: every weight's bytes in the output's data file equal the checkpoint's,
  and the writer says it copied each of them file to file (its progress note); the tied
  embedding is written once; the fp32 model equals eager in onnxruntime;
- a weight changed in memory after loading (its page copied on write) is written from
  memory (so is a neighbour sharing that page), the others still file to file;
- a checkpoint modified after it was mapped, or replaced by another file of the same name,
  is written from memory, with the bytes the model holds.

The checkpoints are written by the test, so their modification time is set back a day: the
writer trusts only files last modified before the process started (see rewrite.files.file_maps).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import time
from pathlib import Path

import onnx
import pytest
import torch

import rewrite
from tests.onnx_fixtures import assert_matches_eager

transformers = pytest.importorskip("transformers")

TOKENS = 6
DAY_NS = 86_400 * 10**9


class Recorder:
    """A progress that keeps the writer's notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def step(self, text: str):
        return contextlib.nullcontext()

    def update(self, text: str) -> None:
        pass

    def transfer(self, done: int, total: int) -> None:
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)

    def copied(self) -> tuple[int, int]:
        """(tensors copied file to file, tensors written) from the weights note."""
        found = [re.search(r"(\d+) of (\d+) tensors .* copied file to file", n)
                 for n in self.notes]
        match = next(m for m in found if m is not None)
        return int(match[1]), int(match[2])


def _checkpoint(folder: Path, dtype: torch.dtype) -> Path:
    """A 2-layer Llama with tied embeddings, random normal weights, saved in ``dtype``; its
    files dated a day back (written before the process started, as a user's are)."""
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(1.0 if parameter.ndim == 1 else 0.0, 0.5)
    model.save_pretrained(folder)
    past = time.time_ns() - DAY_NS
    for path in folder.iterdir():
        os.utime(path, ns=(past, past))
    return folder


def _load(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def _export(model: torch.nn.Module, out: Path) -> Recorder:
    progress = Recorder()
    rewrite.export(model, (torch.arange(TOKENS).unsqueeze(0),), {"use_cache": False},
                   rules="llama", output=out, external_data_threshold=0, progress=progress)
    return progress


def _shard(path: Path) -> dict[str, bytes]:
    """Each tensor's bytes in a safetensors file, read from its header."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    return {name: data[8 + size + e["data_offsets"][0]: 8 + size + e["data_offsets"][1]]
            for name, e in header.items()}


def _written(out: Path) -> dict[str, bytes]:
    """Each initializer's bytes: in the output's external data, or inline (tensors under
    1 KiB stay in the model)."""
    proto = onnx.load(str(out), load_external_data=False)
    data = (out.parent / (out.name + ".data")).read_bytes()
    found = {}
    for tensor in proto.graph.initializer:
        info = {e.key: e.value for e in tensor.external_data}
        if not info:
            found[tensor.name] = onnx.numpy_helper.to_array(tensor).tobytes()
            continue
        start = int(info.get("offset", 0))
        found[tensor.name] = data[start:start + int(info["length"])]
    return found


def _memory(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_weights_are_copied_file_to_file_byte_equal(tmp_path, dtype):
    folder = _checkpoint(tmp_path / "ckpt", dtype)
    model = _load(folder, dtype)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    progress = _export(model, out)
    stored = _shard(folder / "model.safetensors")
    written = _written(out)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    names = [name for name in parameters if name in written]
    assert {id(parameters[name]) for name in names} == {id(p) for p in parameters.values()}
    assert len(names) == len(set(map(id, parameters.values())))  # the tied head once
    for name in names:
        want = stored.get(name, stored["model.embed_tokens.weight"])  # the tied head
        assert written[name] == want == _memory(parameters[name]), name
    copied, total = progress.copied()  # the weights in the data file (over 1 KiB)
    in_data = [name for name in names if parameters[name].nbytes > 1024]
    assert copied == len(in_data) < len(names) and total == len(written), progress.notes
    assert "written while exporting" in progress.notes[-1]  # while torch.export ran
    data = (out.parent / "model.onnx.data").read_bytes()
    assert data.count(stored["model.embed_tokens.weight"]) == 1  # tied: written once
    onnx.checker.check_model(str(out), full_check=True)
    if dtype == torch.float32:
        ids = torch.arange(TOKENS).unsqueeze(0)
        assert_matches_eager(str(out), (model, (ids,), {"use_cache": False}))


def test_a_weight_written_in_memory_is_written_from_memory(tmp_path):
    folder = _checkpoint(tmp_path / "ckpt", torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    changed = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        changed[0, 0] += 1  # one page of the private mapping becomes the process's own
    out = tmp_path / "model.onnx"
    progress = _export(model, out)
    written = _written(out)
    name = "model.layers.0.mlp.up_proj.weight"
    assert written[name] == _memory(changed) != _shard(folder / "model.safetensors")[name]
    page = os.sysconf("SC_PAGE_SIZE")
    dirty = changed.data_ptr() // page  # a neighbour sharing that page is written from memory
    clean = [p for p in model.parameters() if p.nbytes > 1024  # over 1 KiB: in the data
             and not p.data_ptr() // page <= dirty <= (p.data_ptr() + p.nbytes - 1) // page]
    assert progress.copied()[0] == len(clean) < len(list(model.parameters())), progress.notes
    # the others written while exporting, the changed one appended after them
    assert "written while exporting" in progress.notes[-1], progress.notes[-1]
    assert "from memory appended" in progress.notes[-1]


@pytest.mark.parametrize("change", ["rewritten in place", "replaced"])
def test_a_checkpoint_changed_after_mapping_is_written_from_memory(tmp_path, change):
    folder = _checkpoint(tmp_path / "ckpt", torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    shard = folder / "model.safetensors"
    data = shard.read_bytes()
    norm = _shard(shard)["model.norm.weight"]
    if change == "rewritten in place":  # another program writes into the mapped file
        with open(shard, "r+b") as f:
            f.seek(data.index(norm))
            f.write(bytes(len(norm)))
    else:  # the same bytes in a new file under the same name (another inode)
        shard.with_name("new").write_bytes(data)
        os.utime(shard.with_name("new"), ns=(time.time_ns() - DAY_NS,) * 2)
        os.replace(shard.with_name("new"), shard)
    out = tmp_path / "model.onnx"
    progress = _export(model, out)
    assert progress.copied()[0] == 0, progress.notes
    written = _written(out)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in written:
            assert written[name] == _memory(parameter), name
    assert written["model.norm.weight"] == _memory(model.model.norm.weight)
