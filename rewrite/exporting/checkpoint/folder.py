"""A Hugging Face checkpoint folder, checked before anything slow reads it.

What is checked, each failure one :class:`InputError` line (exit 2): the folder exists and
holds ``config.json`` (a JSON object naming its ``architectures``) and weights; a config that
asks for code from the folder (``auto_map``) and pickled ``*.bin`` weights are refused unless
trusted (loading them runs code from the folder); every shard the index names exists; every
``*.safetensors`` file is as long as its header says (a truncated or padded download).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from attrs import frozen

from rewrite.errors import InputError

CONFIG = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED_INDEX = "pytorch_model.bin.index.json"
TRUST_HINT = ("loading it runs code from the folder: only for checkpoints you trust, with "
              "--trust-model")


@frozen
class Checkpoint:
    """A checked checkpoint folder."""

    path: Path
    config: dict
    """``config.json`` as read."""
    weights: tuple[Path, ...]
    """The weight files (shards in index order, else the folder's files by name)."""
    safetensors: bool
    """Whether the weights are ``*.safetensors`` (else pickled ``*.bin``)."""

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def architecture(self) -> str:
        """The model class the config names (its first ``architectures`` entry)."""
        return self.config["architectures"][0]

    @property
    def remote_code(self) -> bool:
        return "auto_map" in self.config


def read_checkpoint(folder: str | Path, *, trust_model: bool = False) -> Checkpoint:
    """Check ``folder`` (see the module docstring) and return what it holds."""
    path = Path(folder)
    if not path.is_dir():
        what = "no such folder" if not path.exists() else "not a folder"
        raise InputError(f"{path}: {what}; expected a checkpoint folder (config.json and "
                         "*.safetensors)")
    config = _config(path)
    if "auto_map" in config and not trust_model:
        raise InputError(f"{path / CONFIG}: asks for the folder's own model code (auto_map); "
                         f"{TRUST_HINT}")
    weights, safetensors = _weights(path)
    if not safetensors and not trust_model:
        raise InputError(f"{path}: weights are pickled ({weights[0].name}); {TRUST_HINT}, or "
                         "convert them to safetensors")
    if safetensors:
        for shard in weights:
            _check_safetensors(shard)
    return Checkpoint(path, config, weights, safetensors)


def _config(path: Path) -> dict:
    file = path / CONFIG
    if not file.is_file():
        raise InputError(f"{path}: no {CONFIG}; expected a checkpoint folder (config.json and "
                         "*.safetensors)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{file}: not a readable JSON file: {e}") from e
    if not isinstance(config, dict):
        raise InputError(f"{file}: not a JSON object")
    names = config.get("architectures")
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise InputError(f"{file}: names no model class ('architectures'); add the class, "
                         "e.g. \"architectures\": [\"LlamaForCausalLM\"]")
    return config


def _weights(path: Path) -> tuple[tuple[Path, ...], bool]:
    """The weight files and whether they are safetensors (preferred when both exist)."""
    for index, pattern, safe in ((SAFETENSORS_INDEX, "*.safetensors", True),
                                 (PICKLED_INDEX, "*.bin", False)):
        if (path / index).is_file():
            return _shards(path / index), safe
        files = sorted(p for p in path.glob(pattern) if p.is_file())
        if files:
            return tuple(files), safe
    raise InputError(f"{path}: no weights (*.safetensors, or a {SAFETENSORS_INDEX} naming "
                     "them)")


def _shards(index: Path) -> tuple[Path, ...]:
    """The files the index's ``weight_map`` names, in order of first mention; all present."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            AttributeError) as e:
        raise InputError(f"{index}: not a weights index (a JSON object with a weight_map): "
                         f"{e}") from e
    shards = [index.parent / name for name in names]
    missing = [name for name, file in zip(names, shards) if not file.is_file()]
    if missing:
        raise InputError(f"{index}: names {len(missing)} missing shard"
                         f"{'s' if len(missing) > 1 else ''}: {', '.join(missing[:3])}")
    if not shards:
        raise InputError(f"{index}: its weight_map is empty")
    return tuple(shards)


def _check_safetensors(file: Path) -> None:
    """The file's size equals its header's length plus the end of its last tensor."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(f.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                  default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise InputError(f"{file}: not a safetensors file ({e})") from e
    if size != 8 + length + end:
        raise InputError(f"{file}: {size} bytes, but its header says {8 + length + end}; "
                         "the file is truncated or corrupt")
