"""Write a model atomically; weights go to ``OUT.onnx.data`` above a size threshold."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx_ir as ir

from rewrite.errors import InputError
from rewrite.outputs import atomic_path

EXTERNAL_TENSOR_BYTES = 1024


def tensor_bytes(model: ir.Model) -> int:
    """Bytes of the initializers (what decides whether external data is needed)."""
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total


def data_path(output: str | Path) -> Path:
    """Where external data of ``output`` goes: ``OUT.onnx.data`` beside it."""
    out = Path(output)
    return out.with_name(out.name + ".data")


def write_model(model: ir.Model, output: str | Path, *, threshold: int) -> bool:
    """Write ``model`` to ``output``; returns True when weights went to external data.

    Files appear complete or not at all: everything is written to temporary names in the
    output's folder, then renamed (the data file first, so the model never points at a
    missing or partial one)."""
    out = Path(output)
    external = tensor_bytes(model) > threshold
    try:
        if not external:
            with atomic_path(out) as tmp:
                ir.save(model, tmp)
            return False
        data = data_path(out)
        folder = tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)
        try:
            staged = Path(folder) / out.name
            # every tensor of 1 KiB or more (or above a lower threshold) goes to the data file
            ir.save(model, staged, external_data=data.name,
                    size_threshold_bytes=min(EXTERNAL_TENSOR_BYTES, threshold))
            os.replace(Path(folder) / data.name, data)
            os.replace(staged, out)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return True
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
