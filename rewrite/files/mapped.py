"""Tensors that are views of a mapped file, and where their bytes lie in it.

The ``.pt2`` frontend maps the file once and makes every archive entry one storage over its
bytes in that mapping (tensors of one entry share a storage, tensors of different entries do
not, as with ``torch.export.load``); it describes that mapping as a :class:`MappedFile`,
which travels with the program it loaded: on the graph IR (``Graph.mapped``), through the
ONNX backend's lowering (``Lowered.mapped``), to the writer, which asks
:func:`file_ranges` where its initializers lie and copies the bytes of those it finds file
to file, without reading them into the process. Nothing is kept in a registry: what a load
mapped is known to the code holding its result. Tensors in mappings rewrite did not make
(transformers maps safetensors shards; ``rewrite.export``'s modules) are looked up in the
kernel's list of the process's mappings, and trusted only where their bytes provably equal
the file's (:mod:`rewrite.files.file_maps`).

The mapping is private (copy on write): nothing rewrite or torch does to a weight can change
the file, and a view whose bytes were written in memory would no longer equal the file; no
step of rewrite or of torch's exporter writes into a program's weights.

A mapping's bytes are checked (checksums) on a thread: :func:`start_checks` starts it when
lowering begins, :func:`verify` (the ONNX writer, ``to_onnx``, the FX backend) waits for it
before the weights are handed on. What reads only shapes (``explain``, ``suggest``) reads no
weight.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import torch
from attrs import field, frozen

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


@frozen(eq=False)
class MappedFile:
    """A whole file that rewrite mapped (private, copy on write): memory ``[start, start +
    length)`` holds the file's bytes from offset 0. Made by the frontend that mapped it
    (:meth:`of`), handed on with what it loaded; holds the mapping, so its addresses stay
    valid while this record lives."""

    path: Path
    """The file, a resolved path."""
    start: int
    length: int
    check: Check | None
    """Verifies the mapping's bytes (see :func:`verify`); None: nothing to check."""
    mapping: mmap.mmap = field(repr=False)

    @classmethod
    def of(cls, mapping: mmap.mmap, path: str | os.PathLike,
           check: Check | None = None) -> "MappedFile":
        """The record of ``mapping``, a writable (``ACCESS_COPY``) mapping of the whole file
        at ``path``."""
        view = ctypes.c_char.from_buffer(mapping)
        start = ctypes.addressof(view)
        del view  # releases the buffer: the mapping can still be closed
        return cls(Path(os.path.realpath(path)), start, len(mapping), check, mapping)

    def file_range(self, tensor: torch.Tensor) -> FileRange | None:
        """Where ``tensor``'s bytes lie in this file, or None (not a contiguous view of
        this mapping)."""
        address = _address(tensor) if _plain(tensor) else None
        if address is None:
            return None
        length = tensor.numel() * tensor.element_size()
        offset = address - self.start
        if offset < 0 or offset + length > self.length:
            return None
        return FileRange(self.path, offset, length)

    def holds(self, address: int) -> bool:
        return self.start <= address < self.start + self.length


def start_checks(mapped: Iterable[MappedFile]) -> None:
    """Start checking the bytes of the ``mapped`` files (they will be needed)."""
    for file in mapped:
        if file.check is not None:
            file.check.start()


def verify(mapped: Iterable[MappedFile]) -> None:
    """Wait for the checks of the ``mapped`` files; raises if one is corrupt."""
    for file in mapped:
        if file.check is not None:
            file.check.wait()


def file_ranges(tensors: Sequence[object], mapped: Sequence[MappedFile] = ()
                ) -> list[FileRange | None]:
    """Where each tensor's bytes lie in a file, or None (not a tensor, not contiguous, in no
    file mapping, or not provably equal to the file): in one of the ``mapped`` files first,
    else in the kernel's list of this process's mappings (read once for all of
    ``tensors``)."""
    maps: FileMaps | None = None
    found: list[FileRange | None] = []
    try:
        for tensor in tensors:
            address = _address(tensor) if _plain(tensor) else None  # type: ignore[arg-type]
            own = next((f for f in mapped if address is not None and f.holds(address)), None)
            where = own.file_range(tensor) if own is not None else None  # type: ignore
            if own is None and address is not None:
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
