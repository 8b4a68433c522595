"""``rewrite export DIR`` on unusable folders: one clear line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rewrite
from tests import checkpoints


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A valid sharded Llama checkpoint (never changed: tests break copies of it)."""
    return checkpoints.write("llama", tmp_path_factory.mktemp("good") / "llama", shard="20KB")


def _copy(sharded: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(sharded, folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _index(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def _no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def _no_weights(folder: Path) -> None:
    for file in [*folder.glob("*.safetensors"), folder / "model.safetensors.index.json"]:
        file.unlink()


def _unknown_architecture(folder: Path) -> None:
    _edit_config(folder, architectures=["NoSuchModelForCausalLM"])


def _remote_code(folder: Path) -> None:
    _edit_config(folder, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})


def _pickled(folder: Path) -> None:
    _no_weights(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")


def _missing_shard(folder: Path) -> None:
    shard = sorted(set(_index(folder)["weight_map"].values()))[1]
    (folder / shard).unlink()


def _short_shard(folder: Path) -> None:
    shard = folder / sorted(set(_index(folder)["weight_map"].values()))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-4])


def _not_text(folder: Path) -> None:
    _edit_config(folder, architectures=["ViTModel"])


CASES = {
    _no_config: "no config.json",
    _no_weights: "no weights",
    _unknown_architecture: "architecture 'NoSuchModelForCausalLM' is not a model class",
    _remote_code: "asks for the folder's own model code (auto_map)",
    _pickled: "weights are pickled (pytorch_model.bin)",
    _missing_shard: "names 1 missing shard: model-00002-of-",
    _short_shard: "bytes, but its header says",
    _not_text: "ViTModel does not take input_ids; rewrite export takes text models",
}


@pytest.mark.parametrize("breaks", CASES, ids=[f.__name__.strip("_") for f in CASES])
def test_bad_folder_one_line_exit_2_nothing_written(breaks, sharded, tmp_path, run_cli):
    folder = _copy(sharded, tmp_path)
    breaks(folder)
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "out.onnx"
    r = run_cli("export", folder, "-o", out)
    assert r.code == 2, r
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and CASES[breaks] in lines[0], r.err
    assert "Traceback" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing written
    assert sorted(p.name for p in folder.iterdir()) == before


def test_missing_folder(tmp_path, run_cli):
    r = run_cli("export", tmp_path / "nowhere", "-o", tmp_path / "out.onnx")
    assert r.code == 2 and r.err.strip().endswith(
        "no such folder; expected a checkpoint folder (config.json and *.safetensors)")


def test_library_call_raises_input_error(sharded, tmp_path):
    folder = _copy(sharded, tmp_path)
    _remote_code(folder)
    with pytest.raises(rewrite.InputError, match="auto_map"):
        rewrite.export(folder, output=tmp_path / "out.onnx")
    with pytest.raises(rewrite.InputError, match="cache='paged'"):
        rewrite.export(sharded, cache="paged")
    with pytest.raises(rewrite.InputError, match="checkpoint folder is exported with its own"):
        rewrite.export(sharded, (1,))
    assert not (tmp_path / "out.onnx").exists()


def test_unwritable_output_refused_before_the_model_class_is_imported(sharded, tmp_path):
    """The output's folder is checked first: a typo in ``-o`` costs no model build (Llama's
    modeling module alone takes over a second to import)."""
    script = ("import sys, rewrite\n"
              "try:\n"
              f"    rewrite.export({str(sharded)!r}, output={str(tmp_path / 'no' / 'x.onnx')!r})\n"
              "except rewrite.InputError as e:\n"
              "    print(e)\n"
              "print('transformers.models.llama.modeling_llama' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    refusal, imported = done.stdout.splitlines()
    assert refusal.endswith(f"cannot write there: folder {tmp_path / 'no'} does not exist")
    assert imported == "False"
    assert not (tmp_path / "no").exists()
