"""Weights read where they lie and written once: what a user of ``rewrite apply`` on a
``.pt2`` sees.

- every dtype a model stores round-trips byte for byte from the ``.pt2`` entry to the
  output's external data (bf16, fp16, fp32, fp8, int8/uint8, int32/int64, bool);
- the loaded program's weights are views of the file (no copy in memory) and equal torch's;
- the external data is aligned, chunked on request, and the model passes the full checker
  and equals eager in onnxruntime;
- a model past 2 GB gets external data and passes the checker.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import rewrite
from rewrite.frontends.pt2.program import read_pt2
from tests.onnx_fixtures import assert_matches_eager

ROOT = Path(__file__).resolve().parents[1]
MODULARIZE = ROOT / "rules" / "modularize.rules"

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]


def _values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Non-degenerate values of ``dtype`` (every element drawn at random)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g,
                         dtype=dtype)


class Stores(torch.nn.Module):
    """One buffer per dtype, each read by the forward (converted to float and summed in)."""

    def __init__(self) -> None:
        super().__init__()
        for k, dtype in enumerate(DTYPES):
            self.register_buffer(f"b{k}", _values(dtype, (64, 32), k))
        self.weight = torch.nn.Parameter(_values(torch.float32, (32, 32), 99))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        for k in range(len(DTYPES)):
            y = y + getattr(self, f"b{k}").to(torch.float32)[: x.shape[0]]
        return y


@pytest.fixture(scope="module")
def stores_pt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("stores") / "stores.pt2"
    program = torch.export.export(Stores().eval(), (torch.randn(64, 32),))
    torch.export.save(program, str(path))
    return path


def _entries_by_fqn(pt2: Path) -> dict[str, bytes]:
    """FQN -> the bytes of its archive entry, read with the zip module."""
    with zipfile.ZipFile(pt2) as archive:
        names = archive.namelist()
        root = names[0].split("/")[0] + "/"
        out = {}
        for kind in ("weights", "constants"):
            configs = [n for n in names if n.endswith(f"model_{kind}_config.json")]
            for fqn, meta in json.loads(archive.read(configs[0]))["config"].items():
                out[fqn] = archive.read(f"{root}data/{kind}/{meta['path_name']}")
    return out


def _external_bytes(model: Path) -> dict[str, bytes]:
    """Initializer name -> its bytes in the external data, as the ONNX file points at them
    (or in the model, for a tensor under 1 KiB: those stay inline)."""
    proto = onnx.load(str(model), load_external_data=False)
    out = {}
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            assert len(tensor.raw_data) < 1024, tensor.name
            out[tensor.name] = tensor.raw_data
            continue
        info = {e.key: e.value for e in tensor.external_data}
        with open(model.parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            out[tensor.name] = f.read(int(info["length"]))
    return out


def test_every_dtype_is_written_byte_for_byte(run_cli, stores_pt2, tmp_path):
    out = tmp_path / "stores.onnx"
    r = run_cli("apply", MODULARIZE, stores_pt2, "-o", out, "--external-data", "always",
                "--no-optimize")
    assert r.code == 0, r.err
    onnx.checker.check_model(str(out), full_check=True)
    stored = _entries_by_fqn(stores_pt2)
    written = _external_bytes(out)
    for k, dtype in enumerate(DTYPES):
        assert written[f"b{k}"] == stored[f"b{k}"], dtype
    assert written["weight"] == stored["weight"]
    eager = torch.export.load(str(stores_pt2)).module()
    assert_matches_eager(str(out), (eager, (torch.randn(64, 32),), {}))


def test_optimized_output_equals_eager(run_cli, stores_pt2, tmp_path):
    out = tmp_path / "stores.onnx"
    assert run_cli("apply", MODULARIZE, stores_pt2, "-o", out, "--external-data",
                   "always").code == 0
    onnx.checker.check_model(str(out), full_check=True)
    x = torch.randn(64, 32)
    eager = torch.export.load(str(stores_pt2)).module()  # torch's loader, not ours
    assert_matches_eager(str(out), (eager, (x,), {}))


def test_loaded_weights_are_views_of_the_file_and_equal_torchs(stores_pt2):
    loaded = read_pt2(stores_pt2)
    ours, (mapped,) = loaded.program, loaded.mapped
    theirs = torch.export.load(str(stores_pt2))
    tensors = {**ours.state_dict, **ours.constants}
    assert set(tensors) == {*theirs.state_dict, *theirs.constants}
    for name, want in {**theirs.state_dict, **theirs.constants}.items():
        got = tensors[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
        where = mapped.file_range(got)
        assert where is not None and where.path == stores_pt2.resolve(), name
        with open(stores_pt2, "rb") as f:
            f.seek(where.offset)
            assert f.read(where.length) == want.contiguous().view(torch.uint8).numpy().tobytes()
    assert isinstance(ours.state_dict["weight"], torch.nn.Parameter)


def test_external_data_is_aligned_and_chunked(run_cli, stores_pt2, tmp_path):
    out = tmp_path / "stores.onnx"
    r = run_cli("apply", MODULARIZE, stores_pt2, "-o", out, "--weights-chunk", "5KB",
                "--no-optimize")
    assert r.code == 0, r.err
    data = sorted(p.name for p in tmp_path.iterdir() if p.name != "stores.onnx")
    assert len(data) > 1, data
    assert all(p.stat().st_size <= 5000 or _one_tensor(out, p.name)
               for p in map(tmp_path.joinpath, data))
    onnx.checker.check_model(str(out), full_check=True)
    assert _external_bytes(out)["b0"] == _entries_by_fqn(stores_pt2)["b0"]
    assert f"weights in {len(data)} files" in r.err
    eager = torch.export.load(str(stores_pt2)).module()
    assert_matches_eager(str(out), (eager, (torch.randn(64, 32),), {}))


def _one_tensor(model: Path, data_name: str) -> bool:
    proto = onnx.load(str(model), load_external_data=False)
    users = [t for t in proto.graph.initializer
             if any(e.key == "location" and e.value == data_name for e in t.external_data)]
    return len(users) == 1


def test_large_tensors_start_at_aligned_offsets(tmp_path):
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(700, 701)
            self.b = torch.nn.Linear(701, 700)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = Wide().eval()
    pt2 = tmp_path / "wide.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(3, 700),)), str(pt2))
    out = tmp_path / "wide.onnx"
    from rewrite.backends.onnx import save_onnx

    save_onnx(rewrite.apply(MODULARIZE, pt2), out, external_data_threshold=0)
    proto = onnx.load(str(out), load_external_data=False)
    offsets = {t.name: int({e.key: e.value for e in t.external_data}.get("offset", 0))
               for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    big = [name for name in offsets if name.endswith("weight")]
    assert big and all(offsets[name] % 65536 == 0 for name in big), offsets
    assert_matches_eager(str(out), (model, (torch.randn(3, 700),), {}))


@pytest.mark.slow  # writes and checks 2 GB
def test_a_model_past_2gb_gets_external_data_and_passes_the_checker(run_cli, tmp_path):
    """2.1 GB of fp32 weights: one file could not hold them."""
    class Big(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(2, 16384, 16384))

        def forward(self, x):
            return x @ self.w[0] + x @ self.w[1]

    model = Big().eval()
    with torch.no_grad():
        model.w[0].uniform_(-1, 1)
        model.w[1].copy_(model.w[0].flip(0))
    pt2 = tmp_path / "big.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 16384),)), str(pt2))
    del model
    out = tmp_path / "big.onnx"
    r = run_cli("apply", MODULARIZE, pt2, "-o", out)
    assert r.code == 0, r.err
    assert (tmp_path / "big.onnx.data").stat().st_size >= 2 * 16384 * 16384 * 4
    assert out.stat().st_size < 2**20
    onnx.checker.check_model(str(out), full_check=True)
    stored = _entries_by_fqn(pt2)["w"]
    written = _external_bytes(out)["w"]
    assert len(written) == len(stored)
    assert np.array_equal(np.frombuffer(written[-4096:], np.uint8),
                          np.frombuffer(stored[-4096:], np.uint8))
    assert written == stored


def test_export_writes_the_modules_own_bytes(tmp_path):
    """``rewrite.export(nn.Module, output=...)``: each weight written from the module's own
    memory, byte for byte (bf16 included)."""
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 48)
            self.register_buffer("scale", _values(torch.bfloat16, (48,), 7))

        def forward(self, x):
            return self.a(x) * self.scale.to(torch.float32)

    torch.manual_seed(0)
    model = Mixed().eval()
    out = tmp_path / "mixed.onnx"
    rewrite.export(model, (torch.randn(2, 32),), rules=MODULARIZE, output=out,
                   external_data_threshold=0, optimize=False)
    onnx.checker.check_model(str(out), full_check=True)
    written = _external_bytes(out)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert written[name] == tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()
    assert_matches_eager(str(out), (model, (torch.randn(2, 32),), {}))
