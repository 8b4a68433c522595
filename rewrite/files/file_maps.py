"""Which file a tensor's memory maps, read from the kernel (Linux ``/proc/self``), and whether
its bytes provably equal that file's.

Tensors that rewrite did not map itself (transformers' ``from_pretrained`` makes every weight a
view of a private mapping of its safetensors shard) are found in ``/proc/self/maps``: address
range, offset, device and inode, path. A range is trusted as a copy of the file only when all
of this holds, else it is written from memory (:func:`rewrite.files.mapped.file_ranges` falls back):

- the path still names the mapped file (same device and inode: not replaced or deleted), a
  regular file long enough for the range;
- the file was last modified before this process started (so before it was mapped: the
  mapping time itself is not recorded anywhere), with a second of slack for the clocks;
- no page of a private (copy-on-write) mapping was written in memory: per page,
  ``/proc/self/pagemap`` says whether it is still the file's page (present and file-backed,
  or not yet read) or became the process's own (present and anonymous, or swapped out). That
  reads 8 bytes per 4 KiB page (2 MB for 1 GB of weights), not the weights. A shared mapping
  writes through to the file, so memory and file agree already.

What remains: a file changed by another process between this check and the copy (as for any
copy of a file), and a wall clock stepped by more than the slack since the process started.
Where ``/proc/self/pagemap`` cannot be read, private mappings are never trusted. Other
systems: nothing is found.
"""

from __future__ import annotations

import bisect
import os
import stat
from pathlib import Path

import numpy as np
from attrs import frozen

MAPS = "/proc/self/maps"
PAGEMAP = "/proc/self/pagemap"
CLOCK_SLACK_NS = 1_000_000_000
"""A file modified less than this before the process started is not trusted (timestamps are
coarse; the boot time the start is computed from is whole seconds)."""

_PRESENT, _SWAPPED, _FILE_PAGE = (np.uint64(1 << bit) for bit in (63, 62, 61))
"""Bits of a ``/proc/PID/pagemap`` entry (the kernel's Documentation/admin-guide/mm/pagemap)."""


@frozen
class Region:
    """A file mapping of this process: ``[start, end)`` maps the file from ``offset`` on."""

    start: int
    end: int
    offset: int
    device: int
    inode: int
    path: str
    shared: bool


def parse_maps(text: str) -> list[Region]:
    """The file mappings listed in ``/proc/PID/maps`` text, adjacent pieces of one mapping
    merged (``mprotect`` or ``madvise`` on part of a mapping splits its line)."""
    regions: list[Region] = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/") or fields[4] == "0":
            continue  # anonymous memory, the heap, [vdso], ...
        span, perms, offset, device, inode, path = fields
        start, end = (int(x, 16) for x in span.split("-"))
        major, minor = (int(x, 16) for x in device.split(":"))
        region = Region(start, end, int(offset, 16), os.makedev(major, minor), int(inode),
                        path, perms[3] == "s")
        last = regions[-1] if regions else None
        if (last is not None and last.end == start and last.inode == region.inode
                and last.device == region.device and last.path == path
                and last.shared == region.shared
                and last.offset + (last.end - last.start) == region.offset):
            region = Region(last.start, end, last.offset, region.device, region.inode, path,
                            region.shared)
            regions[-1] = region
        else:
            regions.append(region)
    return regions


def process_start_ns() -> int | None:
    """When this process started (wall clock, ns), rounded down; None if unknown."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return (boot * 10**9) + ticks * 10**9 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class FileMaps:
    """A snapshot of this process's file mappings, to find tensors' bytes in (one per write:
    reading the maps costs a millisecond or two)."""

    def __init__(self, regions: list[Region], started_ns: int | None) -> None:
        self._regions = sorted(regions, key=lambda r: r.start)
        self._starts = [r.start for r in self._regions]
        self._started_ns = started_ns
        self._sizes: dict[tuple[int, int, str], int | None] = {}
        self._pagemap: int | None = None

    @classmethod
    def read(cls) -> "FileMaps":
        """This process's mappings now (none where ``/proc/self/maps`` is missing)."""
        try:
            text = Path(MAPS).read_text()
        except OSError:
            return cls([], None)
        return cls(parse_maps(text), process_start_ns())

    def find(self, address: int, length: int) -> tuple[Path, int] | None:
        """The file and offset whose ``length`` bytes provably equal memory at ``address``
        (see the module docstring), or None."""
        k = bisect.bisect_right(self._starts, address) - 1
        if k < 0 or length <= 0:
            return None
        region = self._regions[k]
        if address + length > region.end:
            return None
        offset = region.offset + address - region.start
        if not self._unchanged(region, offset + length):
            return None
        if not region.shared and not self._pages_untouched(address, length):
            return None
        return Path(region.path), offset

    def _unchanged(self, region: Region, needed: int) -> bool:
        """The path is the mapped file, at least ``needed`` bytes long, not modified since
        before the process started."""
        key = (region.device, region.inode, region.path)
        if key not in self._sizes:
            self._sizes[key] = self._size(region)
        size = self._sizes[key]
        return size is not None and size >= needed

    def _size(self, region: Region) -> int | None:
        """The size of the mapped file if its path still names it, unmodified; else None."""
        try:
            st = os.stat(region.path)
        except OSError:  # deleted (the maps say "/path (deleted)"), unreadable
            return None
        if (stat.S_ISREG(st.st_mode) and st.st_dev == region.device
                and st.st_ino == region.inode and self._started_ns is not None
                and st.st_mtime_ns < self._started_ns - CLOCK_SLACK_NS):
            return st.st_size
        return None

    def _pages_untouched(self, address: int, length: int) -> bool:
        """No page of ``[address, address + length)`` was written in memory (copy on
        write): each is the file's page or not yet read."""
        page = os.sysconf("SC_PAGE_SIZE")
        first, last = address // page, (address + length - 1) // page
        try:
            if self._pagemap is None:
                self._pagemap = os.open(PAGEMAP, os.O_RDONLY)
            data = os.pread(self._pagemap, (last - first + 1) * 8, first * 8)
        except OSError:
            return False
        if len(data) != (last - first + 1) * 8:
            return False
        flags = np.frombuffer(data, dtype="<u8")
        own = ((flags & _PRESENT) != 0) & ((flags & _FILE_PAGE) == 0)
        return not bool(own.any() or ((flags & _SWAPPED) != 0).any())

    def close(self) -> None:
        if self._pagemap is not None:
            os.close(self._pagemap)
            self._pagemap = None
