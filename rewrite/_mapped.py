"""Tensors that are views of a mapped file, and where their bytes lie in it.

The ``.pt2`` frontend maps the file once and makes every weight a view of that mapping
(:func:`register`); the ONNX writer asks :func:`file_range` for each initializer and copies
the bytes of those it knows file to file, without reading them into the process. Shared by
both stages, so it lives here (they never import each other).

The mapping is private (copy on write): nothing rewrite or torch does to a weight can change
the file, and a view whose bytes were written in memory would no longer equal the file; no
step of rewrite or of torch's exporter writes into a program's weights.
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path

import torch
from attrs import frozen


@frozen
class FileRange:
    """``length`` bytes at ``offset`` of the file at ``path`` (a resolved path)."""

    path: Path
    offset: int
    length: int


@frozen
class _Mapping:
    base: int
    length: int
    path: Path
    alive: weakref.ref


_MAPPINGS: dict[int, _Mapping] = {}
"""Start address of a mapping's memory -> the mapping; dead entries are dropped."""


def register(whole: torch.Tensor, mapping: mmap.mmap, path: str | os.PathLike) -> None:
    """``whole`` (a uint8 tensor over all of ``mapping``) maps the file at ``path``."""
    base = whole.untyped_storage().data_ptr()
    _MAPPINGS[base] = _Mapping(base, len(mapping), Path(os.path.realpath(path)),
                               weakref.ref(mapping))


def file_range(tensor: torch.Tensor) -> FileRange | None:
    """Where ``tensor``'s bytes lie in a registered file, or None (not a view of one, not
    contiguous, or the mapping is gone)."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    try:
        base = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # fake or meta tensors have no storage
        return None
    mapping = _MAPPINGS.get(base)
    if mapping is None:
        return None
    if mapping.alive() is None:
        del _MAPPINGS[base]
        return None
    offset = tensor.data_ptr() - base
    length = tensor.numel() * tensor.element_size()
    if offset < 0 or offset + length > mapping.length:
        return None
    return FileRange(mapping.path, offset, length)
