"""Load a ``.pt2`` file (``torch.export.save``) with errors a user can act on."""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from rewrite.errors import InputError


def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    """``torch.export.load`` with a clear :class:`InputError` for every way it can fail."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .pt2 file")
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not a .pt2 archive (truncated or not written by torch.export.save)")
    try:
        return torch.export.load(str(path))
    except Exception as e:  # torch raises many types here; all mean "unreadable"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "not registered" in reason or "pytree" in reason.lower() or "serializ" in reason.lower():
            raise InputError(
                f"{path}: torch.export.load cannot read this program ({reason}). Its inputs or "
                "outputs use a type that is not registered for deserialization; re-export it "
                "with plain tensors/tuples as outputs (for transformers models: "
                "return_dict=False, use_cache=False)"
            ) from None
        raise InputError(f"{path}: torch.export.load failed: {reason}") from None
