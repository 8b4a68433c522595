"""A model file is data: opening a ``.pt2`` runs no code from it, and a broken archive is
refused with a clear message (exit 2), nothing written.

The crafted file here is real: ``torch.export.load`` runs its payload (checked first), and
``rewrite`` must not, unless the user passes ``--trust-model``.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Callable

import onnx
import pytest
import torch

from tests.onnx_fixtures import assert_matches_eager
from tests.test_bad_input import GPT2_RULES, apply_refused, assert_refused, listing

ROOT = Path(__file__).resolve().parents[1]


class _RunsCode:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def rezip(src: Path, dst: Path, *, change: Callable[[str, bytes], bytes | None] | None = None,
          deflate: Callable[[str], bool] = lambda name: False,
          extra: list[tuple[str, bytes]] = ()) -> Path:
    """A copy of the archive ``src``: each entry through ``change(name, data)`` (None drops
    it), compressed where ``deflate(name)``, then the ``extra`` entries."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if change is not None:
                data = change(info.filename, data)
                if data is None:
                    continue
            method = zipfile.ZIP_DEFLATED if deflate(info.filename) else zipfile.ZIP_STORED
            new.writestr(info.filename, data, compress_type=method)
        for name, data in extra:
            new.writestr(name, data)
    return dst


def _evil_pickle(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save((_RunsCode(marker),), buffer)
    return buffer.getvalue()


@pytest.fixture
def crafted(tmp_path, gpt2_pt2):
    """The GPT-2 program whose sample inputs run ``touch <marker>`` when unpickled."""
    marker = tmp_path / "ran"
    evil = _evil_pickle(marker)
    path = rezip(gpt2_pt2, tmp_path / "crafted.pt2",
                 change=lambda name, data: evil if "sample_inputs/" in name else data)
    return path, marker


def test_the_crafted_file_runs_code_in_torch_export_load(crafted):
    path, marker = crafted
    try:
        torch.export.load(str(path))
    except Exception:  # noqa: S110 - torch may fail after running the payload; we check that
        pass
    assert marker.exists()  # so the file below is a real attack


@pytest.mark.parametrize("command", ["explain", "suggest"])
def test_rewrite_refuses_it_and_runs_nothing(run_cli, crafted, command):
    path, marker = crafted
    argv = [command, GPT2_RULES, path] if command == "explain" else [command, path]
    r = run_cli(*argv)
    assert_refused(r, 2, f"{path}: refusing to load: the archive holds data only code "
                   "execution can load (")
    assert "data/sample_inputs/model.pt: sample inputs that only full pickle can load" in r.err
    assert "--trust-model" in r.err
    assert not marker.exists()


def test_apply_refuses_it_and_writes_nothing(run_cli, crafted):
    path, marker = crafted
    apply_refused(run_cli, path.parent, path, path.parent / "out.onnx", 2,
                  f"{path}: refusing to load")
    assert not marker.exists()


def test_trust_model_is_the_opt_in(run_cli, crafted, gpt2_model, tmp_path):
    path, marker = crafted
    out = tmp_path / "out.onnx"
    r = run_cli("apply", GPT2_RULES, path, "-o", out, "--trust-model")
    assert r.code == 0, r.err
    assert marker.exists()  # what the user accepted
    onnx.checker.check_model(str(out), full_check=True)


def test_a_pickled_weight_is_refused_by_name(run_cli, tmp_path, gpt2_pt2):
    def pickled(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        config["config"]["wte.weight"]["use_pickle"] = True
        return json.dumps(config).encode()

    path = rezip(gpt2_pt2, tmp_path / "pickled.pt2", change=pickled)
    r = run_cli("explain", GPT2_RULES, path)
    assert_refused(r, 2, f"{path}: refusing to load")
    assert "data/weights/weight_0: a pickled tensor or object (full pickle)" in r.err


def test_a_torchbind_object_is_refused_by_name(run_cli, tmp_path, gpt2_pt2):
    def with_object(name: str, data: bytes) -> bytes:
        if not name.endswith("model_constants_config.json"):
            return data
        config = json.loads(data)
        config["config"]["obj"] = {"path_name": "custom_obj_0", "is_param": False,
                                   "use_pickle": True, "tensor_meta": None}
        return json.dumps(config).encode()

    root = zipfile.ZipFile(gpt2_pt2).namelist()[0].split("/")[0]
    path = rezip(gpt2_pt2, tmp_path / "object.pt2", change=with_object,
                 extra=[(f"{root}/data/constants/custom_obj_0", b"\x80\x02N.")])
    r = run_cli("explain", GPT2_RULES, path)
    assert_refused(r, 2, f"{path}: refusing to load")
    assert "custom_obj_0: a TorchBind custom object" in r.err


# --- bad archives --------------------------------------------------------------------------


def _weights_config(edit: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def change(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        edit(config["config"])
        return json.dumps(config).encode()
    return change


def _bigger(config: dict) -> None:
    sizes = config["wte.weight"]["tensor_meta"]["sizes"]
    sizes[0]["as_int"] *= 2


def _missing_weight(name: str, data: bytes) -> bytes | None:
    return None if name.endswith("data/weights/weight_1") else data


BAD_ARCHIVES = {  # name -> (how to make it from a good .pt2, the message after "<path>: ")
    "size_mismatch": (lambda src, dst: rezip(src, dst, change=_weights_config(_bigger)),
                      "weight 'wte.weight': its metadata (torch.float32, sizes "),
    "missing_weight": (lambda src, dst: rezip(src, dst, change=_missing_weight),
                       "weight 'wpe.weight': its archive entry "),
    "duplicate_entry": (lambda src, dst: _duplicated(src, dst),
                        "corrupt .pt2 archive (entry "),
    "truncated_entry": (lambda src, dst: _truncated_entry(src, dst),
                        "corrupt .pt2 archive (entry "),
    "zip_bomb": (lambda src, dst: _bomb(src, dst),
                 "compressed archive entry "),
    "overlapping_entries": (lambda src, dst: _overlapping(src, dst),
                            "corrupt .pt2 archive (entries "),
}


def _duplicated(src: Path, dst: Path) -> Path:
    with zipfile.ZipFile(src) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data/weights/weight_2"))
        data = archive.read(name)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        return rezip(src, dst, extra=[(name, data)])


def _central_directory(data: bytearray, name: bytes) -> int:
    """Offset of ``name``'s central directory header in the zip bytes ``data``."""
    at = data.rfind(b"PK\x01\x02" + b"", 0)
    while at != -1:
        length = int.from_bytes(data[at + 28:at + 30], "little")
        if bytes(data[at + 46:at + 46 + length]) == name:
            return at
        at = data.rfind(b"PK\x01\x02", 0, at)
    raise AssertionError(f"{name!r} not in the directory")


def _truncated_entry(src: Path, dst: Path) -> Path:
    """The directory says weight_0 is far longer than the file."""
    data = bytearray(src.read_bytes())
    name = next(n for n in zipfile.ZipFile(src).namelist() if n.endswith("weights/weight_0"))
    at = _central_directory(data, name.encode())
    huge = (len(data) * 4).to_bytes(4, "little")
    data[at + 20:at + 24] = huge  # compressed size
    data[at + 24:at + 28] = huge  # uncompressed size
    dst.write_bytes(bytes(data))
    return dst


def _overlapping(src: Path, dst: Path) -> Path:
    """Two directory entries point at the same local header (the overlapping zip bomb)."""
    data = bytearray(src.read_bytes())
    names = [n for n in zipfile.ZipFile(src).namelist()]
    first = _central_directory(data, names[0].encode())
    second = _central_directory(data, names[1].encode())
    data[second + 42:second + 46] = data[first + 42:first + 46]  # local header offset
    dst.write_bytes(bytes(data))
    return dst


def _bomb(src: Path, dst: Path) -> Path:
    """weight_3 deflated, and declared (and inflating) to 64 MB of zeros."""
    def change(name: str, data: bytes) -> bytes:
        return bytes(64 << 20) if name.endswith("weights/weight_3") else data
    return rezip(src, dst, change=change, deflate=lambda name: name.endswith("weight_3"))


@pytest.mark.parametrize("name", sorted(BAD_ARCHIVES))
def test_bad_archive_is_refused(run_cli, tmp_path, gpt2_pt2, name):
    make, message = BAD_ARCHIVES[name]
    path = make(gpt2_pt2, tmp_path / f"{name}.pt2")
    r = run_cli("explain", GPT2_RULES, path)
    assert_refused(r, 2, f"{path}: {message}")
    apply_refused(run_cli, tmp_path, path, tmp_path / "out.onnx", 2, f"{path}: {message}")


def test_deflated_weights_load_slower_with_a_note(run_cli, tmp_path, gpt2_pt2, gpt2_model):
    path = rezip(gpt2_pt2, tmp_path / "deflated.pt2",
                 deflate=lambda name: "/data/weights/weight_" in name)
    out = tmp_path / "out.onnx"
    r = run_cli("apply", GPT2_RULES, path, "-o", out)
    assert r.code == 0, r.err
    assert "weight entries cannot be mapped" in r.err and "compressed" in r.err
    onnx.checker.check_model(str(out), full_check=True)
    assert_matches_eager(str(out), gpt2_model)


def _flipped_weight(gpt2_pt2: Path, tmp_path: Path) -> Path:
    with zipfile.ZipFile(gpt2_pt2) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("weights/weight_4"))
    data = bytearray(gpt2_pt2.read_bytes())
    data[info.header_offset + 200] ^= 0x01  # inside the entry's bytes, past its header
    path = tmp_path / "flipped.pt2"
    path.write_bytes(bytes(data))
    return path


def test_a_flipped_weight_byte_is_found_before_anything_is_written(run_cli, tmp_path, gpt2_pt2):
    """The weights' checksums are checked on a thread while the program is lowered; the
    writer waits for them: the progress of the lowering, then the refusal, nothing written."""
    path = _flipped_weight(gpt2_pt2, tmp_path)
    before = listing(tmp_path)
    for out in ("out.onnx", "out.py"):
        r = run_cli("apply", GPT2_RULES, path, "-o", tmp_path / out)
        assert r.code == 2 and r.out == "" and "Traceback" not in r.err
        last = r.err.strip().splitlines()[-1]
        assert last.startswith(f"{path}: corrupt .pt2 archive (checksum mismatch in "), r.err
        assert listing(tmp_path) == before


def test_the_library_hands_on_no_corrupt_weights(tmp_path, gpt2_pt2):
    import rewrite

    result = rewrite.apply(GPT2_RULES, _flipped_weight(gpt2_pt2, tmp_path))
    for lower in (result.to_onnx, result.to_fx):
        with pytest.raises(rewrite.InputError, match="checksum mismatch in "):
            lower()


def test_explain_reads_no_weights(run_cli, tmp_path, gpt2_pt2):
    """explain needs shapes only: a corrupt weight does not change the tree it prints."""
    path = _flipped_weight(gpt2_pt2, tmp_path)
    assert run_cli("explain", GPT2_RULES, path).out == run_cli("explain", GPT2_RULES,
                                                               gpt2_pt2).out.replace(
        str(gpt2_pt2), str(path))


# --- when torch's serialization API is not the one rewrite maps ------------------------------


def _unavailable(*args, **kwargs):
    from rewrite._private.torch_programs import Unavailable

    raise Unavailable("torch._export.serde.serialize has no ExportedProgramDeserializer")


def test_without_the_private_api_torch_loads_it_with_a_note(monkeypatch, gpt2_pt2):
    import warnings

    from rewrite.errors import ModelWarning
    from rewrite.frontends.pt2 import program as pt2

    monkeypatch.setattr(pt2, "deserialize_program", _unavailable)
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        program = pt2.load_pt2(gpt2_pt2)
    assert any(issubclass(n.category, ModelWarning) and "torch.export.load" in str(n.message)
               for n in notes)
    want = torch.export.load(str(gpt2_pt2))
    assert program.graph_module.code == want.graph_module.code
    assert all(torch.equal(program.state_dict[k], v) for k, v in want.state_dict.items())


@pytest.mark.parametrize("broken", ["deserialize_program", "pt2_dtype"])
def test_without_the_private_api_a_crafted_file_is_still_refused(monkeypatch, crafted, broken):
    from rewrite.frontends.pt2 import program as pt2

    path, marker = crafted
    monkeypatch.setattr(pt2, broken, _unavailable)
    with pytest.raises(pt2.UnsafeModel, match="sample inputs that only full pickle can load"):
        pt2.load_pt2(path)
    assert not marker.exists()


# --- the weights flags ---------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--weights-chunk", "10XB"], "argument --weights-chunk: not a size: '10XB'"),
    (["--weights-chunk", "0"], "argument --weights-chunk: must be at least one byte"),
    (["--external-data", "sometimes"], "argument --external-data: invalid choice"),
    (["--external-data", "never", "--weights-chunk", "1GB"],
     "--weights-chunk writes external data; it cannot go with --external-data never"),
])
def test_weights_flags_are_checked(run_cli, tmp_path, gpt2_pt2, argv, message):
    r = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", tmp_path / "out.onnx", *argv)
    assert r.code == 2
    assert message in r.err and "Traceback" not in r.err
    assert listing(tmp_path) == []


def test_a_directory_header_zipfile_cannot_read_is_a_corrupt_archive(run_cli, tmp_path,
                                                                   gpt2_pt2):
    """Found by fuzzing: a flipped byte in an entry's 'version needed to extract' made
    zipfile raise NotImplementedError (exit 3)."""
    data = bytearray(gpt2_pt2.read_bytes())
    name = zipfile.ZipFile(gpt2_pt2).namelist()[0].encode()
    at = data.find(b"PK\x01\x02")
    while bytes(data[at + 46:at + 46 + len(name)]) != name:
        at = data.find(b"PK\x01\x02", at + 4)
    data[at + 6:at + 8] = (64).to_bytes(2, "little")  # version needed to extract: 6.4
    path = tmp_path / "version.pt2"
    path.write_bytes(bytes(data))
    r = run_cli("explain", GPT2_RULES, path)
    assert_refused(r, 2, f"{path}: corrupt .pt2 archive (zip file version 6.4)")
