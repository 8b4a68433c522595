"""Cheap checks of a model path, before anything slow reads it."""

from __future__ import annotations

import os
from pathlib import Path

from rewrite.errors import InputError

MODEL_SUFFIXES = (".pt2", ".onnx")


def check_model_path(model: str) -> Path:
    """Raise :class:`InputError` unless ``model`` is a readable, non-empty .pt2/.onnx file."""
    path = Path(model)
    if not path.exists():
        hint = _near_miss(path)
        raise InputError(f"{path}: no such file" + (f" (did you mean {hint}?)" if hint else ""))
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .pt2 or .onnx file")
    suffix = path.suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise InputError(
            f"{path}: unknown model type {suffix or '(no extension)'!r}; expected .pt2 "
            "(torch.export.save) or .onnx (torch.onnx.export)"
        )
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: not readable")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    return path


def _near_miss(path: Path) -> str | None:
    """The same name with the other model suffix, when that file exists."""
    for suffix in MODEL_SUFFIXES:
        try:
            other = path.with_suffix(suffix)
        except ValueError:  # no file name to put a suffix on
            return None
        if other != path and other.is_file():
            return str(other)
    return None
