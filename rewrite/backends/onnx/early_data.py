"""The weights written while the graph is still being made.

``torch.export`` and lowering keep one core busy for seconds; copying the weights is the
kernel's work (``copy_file_range``) and the disk's. When a module's weights lie in files
(``from_pretrained`` maps the safetensors shards), :func:`early_data` starts writing them,
file to file, into the output's staging folder (:mod:`rewrite.files.outputs`) in a background
thread, in the module's own order, before the graph exists; then fsyncs them. Offsets
follow the rule :func:`rewrite.backends.onnx.save.write_model` gives onnx_ir (packed, weights
over 1 MiB at 64 KiB). The thread makes one ``copy_file_range`` call per weight and takes the
GIL only between them: onnx_ir's writer, Python at every step, waited for the exporting
thread at each (2.47 GB in 5 s instead of 1.6 s next to a busy thread).

When the model is written, :meth:`EarlyData.placing` finds each initializer that is one of
those file ranges (still provably equal to the file, :func:`rewrite.files.mapped.file_ranges`) in
the data written early, and the writer refers to it there; a packed weight (q / k / v, gate /
up: :mod:`rewrite.backends.onnx.packed`) whose parts were written end to end, rows after
rows, is referred to as one range. An initializer over
``EXTERNAL_TENSOR_BYTES`` that is not in a file (a constant of the graph: the slot indices of a
static export, 16 KB at a context of 2048; a weight changed in memory) is appended after the
early data, aligned by the same rule.
The early data is used only when every byte of it is used (no dead bytes in the output).
Otherwise (a weight the graph does not use, or holds transformed) it is removed and the model
is written as without it: never a different model, at worst no time saved.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import onnx_ir as ir

from rewrite.backends.onnx.packed import PackedWeight
from rewrite.files.mapped import FileRange, file_ranges
from rewrite.files.outputs import staging_folder

if TYPE_CHECKING:
    import torch

ALIGN_ABOVE = 1 << 20
"""Weights over this many bytes start at aligned offsets (onnx_ir's default threshold, which
:func:`rewrite.backends.onnx.save.write_model` keeps)."""
CHUNK = 8 << 20
"""Bytes per read where the kernel cannot copy."""


class EarlyData:
    """A data file written in a background thread from file ranges, in ``folder``."""

    def __init__(self, folder: Path, name: str, ranges: list[FileRange], *,
                 alignment: int) -> None:
        self.folder, self.name, self.ranges = folder, name, ranges
        self.offsets: dict[FileRange, int] = {}
        self.appended: list[int] = []
        """The sizes of the tensors written from memory, appended after the early data."""
        self.placed = 0
        """Tensors of the model :meth:`placing` found in the early data."""
        self.seconds = 0.0
        self._alignment = alignment
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rewrite-early-data",
                                        daemon=True)

    @property
    def nbytes(self) -> int:
        return sum(r.length for r in self.ranges)

    def start(self) -> "EarlyData":
        self._thread.start()
        return self

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self._write()
        except BaseException as e:  # handed to the main thread by wait()
            self._error = e
        self.seconds = time.perf_counter() - start

    def _write(self) -> None:
        """One ``copy_file_range`` per weight (this thread takes the GIL only between them:
        a Python-heavy writer here would wait for the exporting thread at every step)."""
        path = self.path
        sources: dict[Path, int] = {}
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for where, offset in zip(self.ranges, self._layout()):
                if self._cancel.is_set():  # nobody will use it: cancel() removes it
                    return
                if where.path not in sources:
                    sources[where.path] = os.open(where.path, os.O_RDONLY)
                _copy(sources[where.path], where, target, offset)
                self.offsets[where] = offset
            os.fsync(target)
        finally:
            for fd in (target, *sources.values()):
                os.close(fd)

    def _layout(self) -> list[int]:
        """Each range's offset in the data file: packed, those over ``ALIGN_ABOVE`` bytes at
        multiples of the alignment (the rule :func:`save.write_model` gives onnx_ir)."""
        offsets, end = [], 0
        for where in self.ranges:
            if where.length > ALIGN_ABOVE:
                end = -(-end // self._alignment) * self._alignment
            offsets.append(end)
            end += where.length
        return offsets

    def wait(self) -> None:
        """Wait for the writing; raises what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Stop writing (after the tensor being copied) and wait; remove what was written."""
        self._cancel.set()
        self._thread.join()
        self.discard()

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.offsets.clear()
        self.appended.clear()

    def placing(self, tensors: list[ir.TensorProtocol], threshold: int
                ) -> list[FileRange | None] | None:
        """Where each of ``tensors`` (the model's initializers) lies in the early data (None:
        at most ``threshold`` bytes, it stays in the model); None when the early data holds
        bytes the model does not use (then it is discarded). A tensor from memory (a
        constant of the graph: a static export's slot indices) is appended to the data, once
        (:meth:`append`)."""
        self.wait()
        ranges = file_ranges([getattr(t, "raw", None) for t in tensors])
        places: list[FileRange | None] = []
        made: dict[int, ir.TensorProtocol] = {}
        used: set[int] = set()
        for tensor, where in zip(tensors, ranges):
            covered = self._covered(tensor, where) if tensor.nbytes > threshold else []
            if tensor.nbytes <= threshold:  # stays in the model (onnx_ir's rule)
                places.append(None)
            elif covered:
                places.append(FileRange(self.path, covered[0], tensor.nbytes))
                used.update(covered)
            else:  # from memory: appended below
                places.append(None)
                made.setdefault(id(tensor), tensor)
        if used != set(self.offsets.values()):
            self.discard()
            return None
        self.placed = sum(place is not None for place in places)
        appended = {key: self.append(tensor) for key, tensor in made.items()}
        return [appended.get(id(tensor), place) for tensor, place in zip(tensors, places)]

    def _covered(self, tensor: ir.TensorProtocol, where: FileRange | None) -> list[int]:
        """The offsets in the early data of what ``tensor`` is: its own range, or the ranges
        of a packed weight's parts (``backends.onnx.packed``: rows concatenated) lying end to
        end in it, as the module's order writes q / k / v and gate / up; else none."""
        if where is not None and where in self.offsets and where.length == tensor.nbytes:
            return [self.offsets[where]]
        if not isinstance(tensor, PackedWeight) or tensor.axis != 0:
            return []
        parts = file_ranges([getattr(part, "raw", None) for part in tensor.parts])
        if any(r is None or r not in self.offsets for r in parts):
            return []
        offsets = [self.offsets[r] for r in parts]  # type: ignore[index]
        ends = [offset + r.length for offset, r in zip(offsets, parts)]  # type: ignore[union-attr]
        if offsets[1:] != ends[:-1] or ends[-1] - offsets[0] != tensor.nbytes:
            return []
        return offsets

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def append(self, tensor: ir.TensorProtocol) -> FileRange:
        """``tensor``'s bytes written at the end of the data (aligned as :meth:`_layout`
        aligns); where. Counted in :attr:`appended`."""
        offset = append_tensor(self.path, tensor, self._alignment)
        self.appended.append(tensor.nbytes)
        return FileRange(self.path, offset, tensor.nbytes)


def append_tensor(data: Path, tensor: ir.TensorProtocol, alignment: int) -> int:
    """``tensor``'s bytes at the end of ``data`` (a tensor over ``ALIGN_ABOVE`` bytes at a
    multiple of ``alignment``, zeros before it); its offset."""
    with open(data, "ab") as f:
        end = f.seek(0, 2)
        offset = -(-end // alignment) * alignment if tensor.nbytes > ALIGN_ABOVE else end
        f.write(b"\0" * (offset - end))
        f.write(tensor.tobytes())
    return offset


def _copy(source: int, where: FileRange, target: int, offset: int) -> None:
    """``where``'s bytes to ``offset`` of ``target``: in the kernel, else through a buffer
    (a file system that cannot copy between these files)."""
    done = 0
    try:
        while done < where.length:
            copied = os.copy_file_range(source, target, where.length - done,
                                        where.offset + done, offset + done)
            if copied == 0:
                raise OSError(errno.EIO, f"{where.path}: shorter than expected")
            done += copied
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while done < where.length:
        chunk = os.pread(source, min(CHUNK, where.length - done), where.offset + done)
        if not chunk:
            raise OSError(errno.EIO, f"{where.path}: shorter than expected")
        done += os.pwrite(target, chunk, offset + done)


def weight_ranges(module: "torch.nn.Module", threshold: int) -> list[FileRange]:
    """The file ranges of ``module``'s parameters and buffers of more than ``threshold``
    bytes (those ``ir.save`` writes as external data) that lie in a file mapping, each once,
    in the module's order."""
    tensors = [t for t in (*module.parameters(), *module.buffers())
               if t.numel() * t.element_size() > threshold]
    ranges = [r for r in file_ranges(tensors) if r is not None]
    return list(dict.fromkeys(ranges))


@contextlib.contextmanager
def early_data(module: "torch.nn.Module", output: Path, data_name: str, *, threshold: int,
               alignment: int, minimum: int) -> Iterator[EarlyData | None]:
    """Within the block, ``module``'s file-mapped weights are being written into a staging
    folder of ``output`` (:class:`EarlyData`); None when they are under ``minimum`` bytes
    (the model's weights would be embedded) or none lie in a file. On leaving the block,
    the writing is waited for or, on an error, cancelled."""
    ranges = weight_ranges(module, threshold)
    if not ranges or sum(r.length for r in ranges) <= minimum:
        yield None
        return
    with staging_folder(output) as folder:
        early = EarlyData(folder, data_name, ranges, alignment=alignment).start()
        try:
            yield early
        except BaseException:
            early.cancel()
            raise
        early.wait()
