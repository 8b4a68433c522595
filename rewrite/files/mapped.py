"""Tensors that are views of a mapped file, and where their bytes lie in it.

The ``.pt2`` frontend maps the file once and makes every archive entry one storage over its
bytes in that mapping (:func:`register`, one call per entry: tensors of one entry share a
storage, tensors of different entries do not, as with ``torch.export.load``); the ONNX
writer asks :func:`file_ranges` for its initializers and copies the bytes of those it knows
file to file, without reading them into the process. Shared by both stages, so it lives here
(they never import each other). Tensors in mappings rewrite did not make (transformers maps
safetensors shards; ``rewrite.export``'s modules) are looked up in the kernel's list of the
process's mappings, and trusted only where their bytes provably equal the file's
(:mod:`rewrite.files.file_maps`).

The mapping is private (copy on write): nothing rewrite or torch does to a weight can change
the file, and a view whose bytes were written in memory would no longer equal the file; no
step of rewrite or of torch's exporter writes into a program's weights.

A mapping's bytes are checked (checksums) on a thread: :func:`start_checks` starts it when
lowering begins, :func:`verify` (the ONNX writer, ``to_onnx``, the FX backend) waits for it
before the weights are handed on. What reads only shapes (``explain``, ``suggest``) reads no
weight.
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import torch
from attrs import frozen

from rewrite.files.file_maps import FileMaps


class Check(Protocol):
    """A check of a mapping's bytes, run on a thread."""

    def start(self) -> None:
        """Start it (a no-op once started)."""

    def wait(self) -> None:
        """Block until it is done; raise (an ``InputError``) if the bytes are corrupt."""


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
    offset: int
    """Where ``base`` lies in the file."""
    alive: weakref.ref
    check: Check | None


_MAPPINGS: dict[int, _Mapping] = {}
"""Start address of a storage over a mapping -> where it lies; dead entries are dropped."""


def register(storage: torch.Tensor, mapping: mmap.mmap, path: str | os.PathLike,
             offset: int = 0, check: Check | None = None) -> None:
    """``storage`` (a uint8 tensor, all of its storage) holds the bytes at ``offset`` of
    the file at ``path``, a view of ``mapping``; ``check`` verifies the mapping's bytes (see
    :func:`verify`)."""
    base = storage.untyped_storage().data_ptr()
    _MAPPINGS[base] = _Mapping(base, storage.untyped_storage().nbytes(),
                               Path(os.path.realpath(path)), offset, weakref.ref(mapping), check)


def _mapping_of(tensor: torch.Tensor) -> _Mapping | None:
    try:
        base = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # fake or meta tensors have no storage
        return None
    mapping = _MAPPINGS.get(base)
    if mapping is not None and mapping.alive() is None:
        del _MAPPINGS[base]
        return None
    return mapping


def _checks(tensors: Iterable[object]) -> list[Check]:
    found = {id(m.check): m.check for t in tensors
             if isinstance(t, torch.Tensor) and (m := _mapping_of(t)) is not None
             and m.check is not None}
    return list(found.values())


def start_checks(tensors: Iterable[object]) -> None:
    """Start checking the mappings ``tensors`` lie in (they will be needed)."""
    for check in _checks(tensors):
        check.start()


def verify(tensors: Iterable[object]) -> None:
    """Wait for the checks of the mappings ``tensors`` lie in; raises if one is corrupt."""
    for check in _checks(tensors):
        check.wait()


def file_ranges(tensors: Sequence[object]) -> list[FileRange | None]:
    """Where each tensor's bytes lie in a file, or None (not a tensor, not contiguous, in no
    file mapping, or not provably equal to the file): a registered mapping first, else the
    kernel's list of this process's mappings (read once for all of ``tensors``)."""
    maps: FileMaps | None = None
    found: list[FileRange | None] = []
    try:
        for tensor in tensors:
            where = file_range(tensor)  # type: ignore[arg-type]
            address = None
            if where is None and _plain(tensor) and _mapping_of(tensor) is None:  # type: ignore
                address = _address(tensor)  # type: ignore[arg-type]
            if address is not None:
                maps = maps or FileMaps.read()
                length = tensor.numel() * tensor.element_size()  # type: ignore[union-attr]
                hit = maps.find(address, length)
                where = FileRange(hit[0], hit[1], length) if hit is not None else None
            found.append(where)
    finally:
        if maps is not None:
            maps.close()
    return found


def _plain(tensor: object) -> bool:
    """A contiguous, non-empty, dense CPU tensor."""
    return (isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided
            and tensor.device.type == "cpu" and tensor.numel() > 0 and tensor.is_contiguous())


def _address(tensor: torch.Tensor) -> int | None:
    """Where the tensor's bytes start in memory (None: fake or meta, no memory)."""
    try:
        tensor.untyped_storage().data_ptr()  # raises for tensors without memory
        return tensor.data_ptr() or None
    except (RuntimeError, NotImplementedError):
        return None


def file_range(tensor: torch.Tensor) -> FileRange | None:
    """Where ``tensor``'s bytes lie in a registered file, or None (not a view of one, not
    contiguous, or the mapping is gone)."""
    if not _plain(tensor):
        return None
    mapping = _mapping_of(tensor)
    if mapping is None:
        return None
    offset = tensor.data_ptr() - mapping.base
    length = tensor.numel() * tensor.element_size()
    if offset < 0 or offset + length > mapping.length:
        return None
    return FileRange(mapping.path, mapping.offset + offset, length)
