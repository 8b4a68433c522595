"""The weights written while the graph is still being made.

``torch.export`` and lowering keep one core busy for seconds; copying the weights is the
kernel's work (``copy_file_range``) and the disk's. When a module's weights lie in files
(``from_pretrained`` maps the safetensors shards), :func:`early_data` starts writing them,
file to file, into the output's staging folder (:mod:`rewrite.outputs`) in a background
thread, in the module's own order, before the graph exists; then fsyncs them. The writing
is onnx_ir's, as for every model (``ir.save`` of a model holding only those weights, with
the same threshold and alignment as :func:`rewrite.backends.onnx.save.write_model`), so
offsets follow the same rules.

When the model is written, :meth:`EarlyData.placing` gives each initializer that is one of
those file ranges (still provably equal to the file, :func:`rewrite._mapped.file_ranges`) an
external tensor over the data written early. It is used only when it covers the model
exactly: every initializer over ``EXTERNAL_TENSOR_BYTES`` written early, and every
byte written early used (no dead bytes in the output). Otherwise (a weight made in memory, a
weight the graph does not use) the early data is removed and the model is written as
without it: never a different model, at worst no time saved.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import onnx_ir as ir

from rewrite._mapped import FileRange, file_ranges
from rewrite.outputs import fsync, staging_folder

if TYPE_CHECKING:
    import torch

EARLY_MODEL = ".early.onnx"
"""The weights-only model ``ir.save`` writes beside the data (removed once written)."""


class Cancelled(Exception):
    """Raised in onnx_ir's callback to stop writing early data nobody will use."""


class EarlyData:
    """A data file written in a background thread from file ranges, in ``folder``."""

    def __init__(self, folder: Path, name: str, ranges: list[FileRange], *,
                 threshold: int, alignment: int) -> None:
        self.folder, self.name, self.ranges = folder, name, ranges
        self.offsets: dict[FileRange, int] = {}
        self.seconds = 0.0
        self._settings = (threshold, alignment)
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
        threshold, alignment = self._settings
        values = [ir.Value(name=f"w{i}", const_value=_external(r, i))
                  for i, r in enumerate(self.ranges)]
        model = ir.Model(ir.Graph([], [], nodes=[], initializers=values), ir_version=10)

        def placed(tensor: ir.TensorProtocol, info: ir.external_data.CallbackInfo) -> None:
            if self._cancel.is_set():
                raise Cancelled
            self.offsets[self.ranges[int(tensor.name[1:])]] = info.offset

        ir.save(model, self.folder / EARLY_MODEL, external_data=self.name,
                size_threshold_bytes=threshold, alignment=alignment, callback=placed)
        (self.folder / EARLY_MODEL).unlink()
        fsync(self.folder / self.name)

    def wait(self) -> None:
        """Wait for the writing; raises what it raised."""
        self._thread.join()
        if self._error is not None and not isinstance(self._error, Cancelled):
            raise self._error

    def cancel(self) -> None:
        """Stop writing (after the tensor being copied) and wait; remove what was written."""
        self._cancel.set()
        self._thread.join()
        self.discard()

    def discard(self) -> None:
        for name in (self.name, EARLY_MODEL):
            (self.folder / name).unlink(missing_ok=True)
        self.offsets.clear()

    def placing(self, tensors: list[ir.TensorProtocol], threshold: int
                ) -> list[ir.TensorProtocol] | None:
        """``tensors`` (the model's initializers) with those written early as external
        tensors over the early data; None when the early data does not cover them exactly
        (then it is discarded)."""
        self.wait()
        ranges = file_ranges([getattr(t, "raw", None) for t in tensors])
        placed: list[ir.TensorProtocol] = []
        used: set[FileRange] = set()
        for tensor, where in zip(tensors, ranges):
            if tensor.nbytes <= threshold:  # stays in the model (onnx_ir's rule)
                placed.append(tensor)
            elif where is not None and where in self.offsets and where.length == tensor.nbytes:
                used.add(where)
                placed.append(ir.ExternalTensor(self.name, self.offsets[where], where.length,
                                                tensor.dtype, shape=tensor.shape,
                                                name=tensor.name, base_dir=str(self.folder)))
            else:
                break
        if len(placed) < len(tensors) or used != set(self.offsets):
            self.discard()
            return None
        return placed


def _external(where: FileRange, index: int) -> ir.ExternalTensor:
    """The bytes of ``where`` as an external tensor (uint8: only the bytes matter here)."""
    return ir.ExternalTensor(where.path.name, where.offset, where.length, ir.DataType.UINT8,
                             shape=ir.Shape([where.length]), name=f"w{index}",
                             base_dir=str(where.path.parent))


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
        early = EarlyData(folder, data_name, ranges, threshold=threshold,
                          alignment=alignment).start()
        try:
            yield early
        except BaseException:
            early.cancel()
            raise
        early.wait()
