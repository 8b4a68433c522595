"""A ``.pt2`` file read as data: its zip entries, where their bytes lie, and their checks.

``torch.export.save`` writes a zip whose entries are stored uncompressed and aligned, so
every weight can be a view of a read-only mapping of the file. This module knows the zip
format only (no torch, no pickle): :func:`open_archive` lists the entries with the offset of
their data, and refuses, with one :class:`InputError` each, what is not a sound archive:
not a zip, a truncated entry, an entry twice, entries whose bytes overlap (the overlapping
"zip bomb"), a compressed entry that claims more bytes than an entry of its kind may hold.
:meth:`Archive.read` returns a small entry's bytes with its checksum verified;
:meth:`Archive.view` a weight's bytes without copying them (:func:`checksums` checks them on
another core, started when someone is going to need the bytes).
"""

from __future__ import annotations

import mmap
import struct
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Iterable

from attrs import field, frozen

from rewrite.errors import InputError

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"
MAX_METADATA_BYTES = 1 << 30
"""Largest entry read into memory that is not a weight (the program's JSON, configs)."""


@frozen
class Entry:
    """One zip entry: where its bytes are and what they should be."""

    name: str
    """The name inside the archive, with the archive's root folder (as the zip lists it);
    :attr:`Archive.entries` is keyed by the name without it."""
    offset: int
    """Where the entry's (stored or compressed) bytes start in the file."""
    size: int
    """Bytes once decompressed (for a stored entry, the bytes in the file)."""
    stored_size: int
    """Bytes in the file."""
    compressed: bool
    crc: int


@frozen
class Archive:
    """An open ``.pt2`` file: its entries by name, and a private read-only mapping of it.

    The mapping lives as long as any tensor made over it; pages are read from the file on
    first touch and count as the file's memory, not the process's."""

    path: Path
    root: str
    """The folder every entry is in (``torch.export.save`` names it after the file)."""
    entries: dict[str, Entry] = field(repr=False)
    mapping: mmap.mmap | None = field(repr=False)
    """None for an empty archive (nothing to map)."""

    def read(self, name: str, limit: int = MAX_METADATA_BYTES) -> bytes:
        """The bytes of entry ``name``, decompressed if needed, checksum verified."""
        entry = self.entries[name]
        if entry.size > limit:
            raise InputError(f"{self.path}: archive entry {self.root}{name} claims "
                             f"{entry.size:,} bytes, more than such an entry may hold "
                             f"({limit:,}); refusing to read it")
        data = self._bytes(entry)
        if zlib.crc32(data) != entry.crc:
            raise InputError(f"{self.path}: corrupt .pt2 archive (checksum mismatch in "
                             f"{self.root}{name})")
        return data

    def view(self, name: str) -> memoryview:
        """The stored bytes of entry ``name``, unverified and uncopied (a view of the
        mapping); a compressed entry is refused (:meth:`read` it)."""
        entry = self.entries[name]
        if entry.compressed or self.mapping is None:
            raise ValueError(f"{name} is compressed: it cannot be mapped")
        return memoryview(self.mapping)[entry.offset:entry.offset + entry.size]

    def _bytes(self, entry: Entry) -> bytes:
        if not entry.compressed:
            assert self.mapping is not None
            return bytes(self.mapping[entry.offset:entry.offset + entry.size])
        data = self.mapping[entry.offset:entry.offset + entry.stored_size]
        try:
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            out = inflater.decompress(data, entry.size + 1)
        except zlib.error as e:
            raise InputError(f"{self.path}: corrupt .pt2 archive ({entry.name}: {e})"
                             ) from e
        if len(out) != entry.size:
            raise InputError(f"{self.path}: corrupt .pt2 archive ({entry.name} holds "
                             f"{len(out):,} bytes, its header says {entry.size:,})")
        return out


def open_archive(path: Path) -> Archive:
    """The entries of the zip at ``path``, checked (see the module docstring)."""
    if not zipfile.is_zipfile(path):
        raise InputError(
            f"{path}: not a .pt2 archive (truncated, or not written by torch.export.save)")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, struct.error,
            NotImplementedError) as e:  # a header zipfile cannot read (zip file version 6.4)
        raise InputError(f"{path}: corrupt .pt2 archive ({e})") from e
    names = [i.filename for i in infos]
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names) and not any(
            n.endswith("archive_format") for n in names):
        raise InputError(
            f"{path}: a torch.save file, not a torch.export.save program; export the model "
            "with torch.export.export and save it with torch.export.save")
    size = path.stat().st_size
    with open(path, "rb") as file:
        mapping = (mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) if size else None)
    try:
        entries = _entries(path, infos, mapping, size)
    except BaseException:
        if mapping is not None:
            mapping.close()
        raise
    root = _root(path, names)
    return Archive(path, root, {n[len(root):]: e for n, e in entries.items()}, mapping)


def _root(path: Path, names: list[str]) -> str:
    """The folder all entries share (``model/``), as torch's reader strips it."""
    formats = [n for n in names if n.rsplit("/", 1)[-1] == "archive_format"]
    if not formats:
        raise InputError(f"{path}: not a torch.export.save archive (no archive_format entry)")
    root = formats[0][: -len("archive_format")]
    if root.count("/") > 1 or any(not n.startswith(root) for n in names):
        raise InputError(f"{path}: corrupt .pt2 archive (entries outside its folder "
                         f"{root or '/'})")
    return root


def _entries(path: Path, infos: list[zipfile.ZipInfo], mapping: mmap.mmap | None,
             size: int) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for info in infos:
        if info.filename in entries:
            raise InputError(f"{path}: corrupt .pt2 archive (entry {info.filename} appears "
                             "twice)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InputError(f"{path}: archive entry {info.filename} uses a compression "
                             f"torch.export.save does not write (method {info.compress_type})")
        if info.flag_bits & 0x1:
            raise InputError(f"{path}: archive entry {info.filename} is encrypted")
        offset = _data_offset(path, info, mapping, size)
        if offset + info.compress_size > size:
            raise InputError(f"{path}: corrupt .pt2 archive (entry {info.filename} is "
                             "truncated: its bytes run past the end of the file)")
        compressed = info.compress_type == zipfile.ZIP_DEFLATED
        if not compressed and info.compress_size != info.file_size:
            raise InputError(f"{path}: corrupt .pt2 archive (entry {info.filename}: stored "
                             f"size {info.compress_size:,} != size {info.file_size:,})")
        entries[info.filename] = Entry(info.filename, offset, info.file_size,
                                       info.compress_size, compressed, info.CRC)
    _check_disjoint(path, entries.values())
    return entries


def _data_offset(path: Path, info: zipfile.ZipInfo, mapping: mmap.mmap | None,
                 size: int) -> int:
    """Where ``info``'s bytes start: after its local header, whose name and extra field
    lengths may differ from the central directory's (torch pads the extra field)."""
    start = info.header_offset
    if mapping is None or start + _LOCAL_HEADER.size > size:
        raise InputError(f"{path}: corrupt .pt2 archive (entry {info.filename} is truncated)")
    fields = _LOCAL_HEADER.unpack_from(mapping, start)
    if fields[0] != _LOCAL_SIGNATURE:
        raise InputError(f"{path}: corrupt .pt2 archive (entry {info.filename} has no local "
                         "header where the directory says)")
    name_length, extra_length = fields[9], fields[10]
    return start + _LOCAL_HEADER.size + name_length + extra_length


def _check_disjoint(path: Path, entries: Iterable[Entry]) -> None:
    """Refuse entries whose bytes overlap (a zip bomb reuses one compressed stream)."""
    spans = sorted((e.offset, e.offset + e.stored_size, e.name) for e in entries)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            raise InputError(f"{path}: corrupt .pt2 archive (entries {name} and {other} "
                             "share bytes: a crafted zip, refusing it)")


class Verifier:
    """Checksums of mapped entries computed on a thread once started (zlib releases the
    GIL), so that reading the weights' bytes overlaps with lowering the program."""

    def __init__(self, archive: Archive, names: list[str]) -> None:
        self._archive = archive
        self._names = names
        self._bad: str | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start checking (once; a no-op when started)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pt2-checksums",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        for name in self._names:
            entry = self._archive.entries[name]
            view = self._archive.view(name)
            crc = 0
            for start in range(0, entry.size, 64 << 20):
                crc = zlib.crc32(view[start:start + (64 << 20)], crc)
            if crc != entry.crc:
                self._bad = name
                return

    def wait(self) -> None:
        """Block until every checksum is known; :class:`InputError` for the first bad one."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._bad is not None:
            raise InputError(f"{self._archive.path}: corrupt .pt2 archive (checksum mismatch "
                             f"in {self._archive.root}{self._bad})")


def checksums(archive: Archive, names: list[str]) -> Verifier:
    """A check of the stored entries ``names`` (not started: :meth:`Verifier.start`)."""
    return Verifier(archive, [n for n in names if not archive.entries[n].compressed])
