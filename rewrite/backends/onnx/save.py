"""Write a model and its weights: weights copied file to file, the pair published at once.

Above a size threshold the weights go to external data beside the model (``OUT.onnx.data``,
or numbered chunks of at most ``chunk`` bytes). A weight that is a view of a mapped file (a
``.pt2`` weight, a safetensors shard transformers mapped: :mod:`rewrite._mapped`) or already
external (an ``.onnx`` input's data) is written by onnx_ir as an
:class:`onnx_ir.ExternalTensor`: ``copy_file_range``, file to file, never through the
process's memory; other tensors are written from where they are (no intermediate copy).
The summary note says how many went file to file. Large tensors start at 64 KiB-aligned
offsets, so runtimes can map them. The model and its data files are written under temporary
names in the output's folder and published together (:func:`rewrite.outputs.publish`): a
reader never sees a new model with old data, or the reverse.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import onnx_ir as ir

from rewrite._mapped import FileRange, file_ranges, verify
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.errors import InputError
from rewrite.outputs import publish

EXTERNAL_TENSOR_BYTES = 1024
"""Tensors of at least this many bytes go to the data file (smaller ones stay inline)."""
ALIGNMENT = 65536
"""Offset alignment of tensors over 1 MiB in the data file (the largest page or allocation
granularity runtimes map with)."""
MAX_PROTO_BYTES = 2**31 - 2**26
"""What one ONNX file can hold (protobuf's 2 GiB, minus headroom for the graph)."""


def tensor_bytes(model: ir.Model) -> int:
    """Bytes of the initializers (what decides whether external data is needed)."""
    return sum(v.const_value.nbytes for v in _initializers(model))  # type: ignore[union-attr]


def _initializers(model: ir.Model) -> list[ir.Value]:
    """The initializers with a value, of the main graph and of every subgraph."""
    return [v for graph in model.graphs() for v in graph.initializers.values()
            if v.const_value is not None]


def verify_weights(model: ir.Model) -> None:
    """Wait for the checksums of the input file the model's weights are views of (an
    ``InputError`` if it is corrupt): before they are written or handed on."""
    verify(getattr(v.const_value, "raw", None) for v in _initializers(model))


def data_path(output: str | Path) -> Path:
    """Where external data of ``output`` goes: ``OUT.onnx.data`` beside it."""
    out = Path(output)
    return out.with_name(out.name + ".data")


def by_reference(tensor: ir.TensorProtocol, where: FileRange | None) -> ir.TensorProtocol:
    """``tensor`` as an external tensor over ``where``, the file range its bytes lie in
    (:func:`rewrite._mapped.file_ranges` of its ``raw``); else ``tensor``."""
    if where is None or where.length != tensor.nbytes:
        return tensor
    return ir.ExternalTensor(where.path.name, where.offset, where.length, tensor.dtype,
                             shape=tensor.shape, name=tensor.name,
                             base_dir=str(where.path.parent))


def write_model(model: ir.Model, output: str | Path, *, threshold: int,
                chunk: int | None = None, progress: Progress = SILENT) -> list[Path]:
    """Write ``model`` to ``output``; returns the external data files written (none when
    the weights are embedded: at most ``threshold`` bytes and no ``chunk`` given)."""
    out = Path(output)
    verify_weights(model)
    total = tensor_bytes(model)
    external = total > threshold or chunk is not None
    if not external and total > MAX_PROTO_BYTES:
        raise InputError(f"{out}: {total:,} bytes of weights do not fit in one ONNX file "
                         "(2 GB at most): write them as external data")
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    try:
        staged = folder / out.name
        if external:
            start = time.perf_counter()
            with _weights_by_reference(model) as copied, progress.step("writing weights"):
                _save_external(model, staged, total, min(EXTERNAL_TENSOR_BYTES, threshold),
                               chunk, progress)
            seconds = time.perf_counter() - start
            progress.note(f"weights: {total / 1e9:.2f} GB in {seconds:.1f}s "
                          f"({total / 1e9 / max(seconds, 1e-9):.2f} GB/s); {copied}")
        else:
            ir.save(model, staged)
        data = sorted(p.name for p in folder.iterdir() if p.name != out.name)
        publish({staged: out, **{folder / name: out.parent / name for name in data}},
                replaces=[data_path(out)])
        return [out.parent / name for name in data]
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _weights_by_reference(model: ir.Model) -> Iterator[str]:
    """Within the block, the model's initializers that lie in a mapped file are
    :class:`onnx_ir.ExternalTensor`\\ s over it (the model is restored afterwards); yields
    how many (``12 of 14 tensors (0.52 GB) copied file to file``)."""
    values = _initializers(model)
    tensors = [v.const_value for v in values]
    ranges = file_ranges([getattr(t, "raw", None) for t in tensors])
    for value, tensor, where in zip(values, tensors, ranges):
        value.const_value = by_reference(tensor, where)  # type: ignore[arg-type]
    try:
        copied = [v.const_value for v in values
                  if isinstance(v.const_value, ir.ExternalTensor)]
        yield (f"{len(copied)} of {len(values)} tensors "
               f"({sum(t.nbytes for t in copied) / 1e9:.2f} GB) copied file to file")
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor


def _save_external(model: ir.Model, staged: Path, total: int, smallest: int,
                   chunk: int | None, progress: Progress) -> None:
    """Tensors of ``smallest`` bytes or more go to the data file(s)."""
    name = data_path(staged).name
    ir.save(model, staged, external_data=name,
            size_threshold_bytes=smallest, max_shard_size_bytes=chunk,
            alignment=ALIGNMENT, callback=_byte_counter(total, progress))


def _byte_counter(total: int, progress: Progress) -> Callable:
    """onnx_ir's per-tensor callback (called before each tensor is written) as progress."""
    done = 0

    def callback(tensor: ir.TensorProtocol, info: object) -> None:
        nonlocal done
        progress.transfer(done, total)
        done += tensor.nbytes
    return callback

