"""Write a model and its weights: weights copied file to file, the pair published at once.

Above a size threshold the weights go to external data beside the model (``OUT.onnx.data``,
or numbered chunks of at most ``chunk`` bytes). A weight that is a view of a mapped file (a
``.pt2`` weight, in the file the lowering hands on with the model; a safetensors shard
transformers mapped: :mod:`rewrite.files.mapped`) or already external (an ``.onnx``
input's data) is written by onnx_ir as an :class:`onnx_ir.ExternalTensor`:
``copy_file_range``, file to file, never through the process's memory; other tensors are
written from where they are (no intermediate copy).
The summary note says how many went file to file. Large tensors start at 64 KiB-aligned
offsets, so runtimes can map them. Weights under ``EXTERNAL_TENSOR_BYTES`` stay in the model
whatever the threshold. The model and its data files are written in a staging folder beside
the output and published crash-safe (:func:`rewrite.files.outputs.publish`): killed at any instant,
the output is the old pair or the new one, never a mix. Files that belong with the model
(``beside``: ``genai_config.json``, tokenizer files) are staged and published with it.
A model with its weights embedded is written holding each weight once
(:mod:`rewrite.backends.onnx.embedded`).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import onnx
import onnx_ir as ir

from rewrite.files.mapped import FileRange, MappedFile, file_ranges, verify
from rewrite._private.onnx_files import chunk_names
from rewrite.backends.onnx.early_data import EarlyData, early_data
from rewrite.backends.onnx.embedded import save_embedded
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.backends.onnx.shared_data import (
    Sibling,
    graphs,
    initializers,
    save_sharing,
    stale_siblings,
)
from rewrite._shared.heap import give_back_freed
from rewrite.errors import InputError
from rewrite.files.outputs import Beside, Staged, publish, reading_copy, staging_folder

if TYPE_CHECKING:
    import torch

EXTERNAL_TENSOR_BYTES = 1024
"""Tensors of more than this many bytes go to the data file, whatever the threshold (others
stay inline, as ``onnx.external_data_helper.convert_model_to_external_data``'s default
keeps them: the shapes and axes that onnxruntime's shape inference must read from the model;
``--external-data always`` means the weights)."""
ALIGNMENT = 65536
"""Offset alignment of tensors over 1 MiB in the data file (the largest page or allocation
granularity runtimes map with)."""
MAX_PROTO_BYTES = 2**31 - 2**26
"""What one ONNX file can hold (protobuf's 2 GiB, minus headroom for the graph)."""
WRITERS = 2
"""Threads writing the data file (onnx_ir's ``max_workers``): a weight made when written (a
conversion, int4 blocks) is computed while another is written; the bytes are the same."""
IN_FLIGHT_BYTES = 256 << 20
"""What the writers may hold at once besides the largest weight (onnx_ir's
``max_in_flight_bytes``): the memory of a serial write."""


def tensor_bytes(model: ir.Model) -> int:
    """Bytes of the initializers (what decides whether external data is needed)."""
    return sum(v.const_value.nbytes for v in initializers(model))  # type: ignore[union-attr]


def data_path(output: str | Path) -> Path:
    """Where external data of ``output`` goes: ``OUT.onnx.data`` beside it."""
    out = Path(output)
    return out.with_name(out.name + ".data")


def by_reference(tensor: ir.TensorProtocol, where: FileRange | None) -> ir.TensorProtocol:
    """``tensor`` as an external tensor over ``where``, the file range its bytes lie in
    (:func:`rewrite.files.mapped.file_ranges` of its ``raw``); else ``tensor``."""
    if where is None or where.length != tensor.nbytes:
        return tensor
    return ir.ExternalTensor(where.path.name, where.offset, where.length, tensor.dtype,
                             shape=tensor.shape, name=tensor.name,
                             base_dir=str(where.path.parent))


def weights_early(module: "torch.nn.Module", output: Path, *, threshold: int,
                  chunk: int | None) -> contextlib.AbstractContextManager[EarlyData | None]:
    """Within the block, ``module``'s file-mapped weights are being written for ``output``
    (:mod:`early_data`), to be given to :func:`write_model`; None where it cannot help
    (chunked data, weights that would be embedded: at most ``threshold`` bytes)."""
    if chunk is not None:
        return contextlib.nullcontext(None)
    return early_data(module, output, data_path(output).name, threshold=EXTERNAL_TENSOR_BYTES,
                      alignment=ALIGNMENT, minimum=threshold)


def write_model(model: ir.Model, output: str | Path, *, threshold: int,
                chunk: int | None = None, progress: Progress = SILENT,
                early: EarlyData | None = None,
                check: Callable[[Path], str] | None = None,
                beside: Beside = Beside(),
                mapped: Sequence[MappedFile] = (),
                siblings: Sequence[Sibling] = ()) -> list[Path]:
    """Write ``model`` to ``output``; returns the external data files written (none when
    the weights are embedded: at most ``threshold`` bytes and no ``chunk`` given).
    ``early``: its weights written while the model was made (:func:`weights_early`), used
    when they are exactly the model's. ``check``: run on the staged model file before it is
    published (its note is reported; what it raises leaves the output as it was).
    ``beside``: files published with the model.
    ``mapped``: the files the model's weights may be views of, as the frontend mapped them
    (``Lowered.mapped``), checked before they are copied (an ``InputError`` if one is
    corrupt). ``siblings``: further models beside ``output`` reading its data file (then
    always external), each weight in it once (:mod:`shared_data`), published with it."""
    out = Path(output)
    verify(mapped)
    total = tensor_bytes(model)
    external = total > threshold or chunk is not None or bool(siblings)
    if not external and total > MAX_PROTO_BYTES:
        raise InputError(f"{out}: {total:,} bytes of weights do not fit in one ONNX file "
                         "(2 GB at most): write them as external data")
    try:
        with _staging(out, early) as folder:
            staged = folder / out.name
            if external:
                with progress.step("writing weights"):
                    note = _save_external(model, staged, total, chunk, progress, early,
                                          mapped)
                progress.note(note)
                for sibling in siblings:
                    save_sharing(sibling.model, folder / sibling.output.name, model, staged,
                                 inline=EXTERNAL_TENSOR_BYTES, alignment=ALIGNMENT,
                                 default_data=data_path(out).name)
            else:
                if early is not None:  # embedded after all: the early data is not needed
                    early.cancel()
                with _swapped(model, _in_memory):  # a .onnx input's external weights, embedded
                    save_embedded(model, staged)  # each weight held once, when written
            data = _publish_staged(out, folder, [(staged, check), *(
                (folder / s.output.name, s.check) for s in siblings)], beside, progress)
            return [out.parent / name for name in data]
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from e


def _data_files(folder: Path, models: set[str]) -> tuple[str, ...]:
    """The data files in the staging ``folder``: not the ``models`` (nor empty: no tensor
    in it)."""
    return tuple(sorted(p.name for p in folder.iterdir()
                        if p.name not in models and p.stat().st_size))


def _publish_staged(out: Path, folder: Path, models: list[tuple[Path, Callable | None]],
                    beside: Beside, progress: Progress) -> tuple[str, ...]:
    """Check the staged ``models`` (the output's first, then its siblings), stage their
    copies reading the staging folder and the companion files, publish them all; the
    names of the data files."""
    data = _data_files(folder, {path.name for path, _ in models})
    if any(check is not None for _, check in models):
        give_back_freed()  # what writing freed, before eager and onnxruntime run
    for path, check in models:
        if check is not None:
            what = "" if path.name == out.name else f" ({path.name})"
            with progress.step(f"checking the written model{what} against eager PyTorch"):
                progress.note(check(path))
    first = None
    if data:
        first = _reading_folder(models[0][0], folder.name)
        for path, _ in models[1:]:
            _reading_folder(path, folder.name)
    for companion in beside.files:
        companion.write(folder)
    names = tuple(path.name for path, _ in models[1:])
    stale = _stale_data(out)
    publish(out, Staged(folder, models[0][0], first, data,
                        tuple(c.name for c in beside.files), names),
            stale=[*stale, *beside.stale],
            retire=stale_siblings(out, {*stale, *data}, set(names)))
    return data


def _reading_folder(model: Path, folder: str) -> Path:
    """A copy of the saved ``model`` whose external data is read inside ``folder`` (the
    staging folder, beside the output): the model published first (:mod:`rewrite.files.outputs`)."""
    proto = onnx.load(str(model), load_external_data=False)
    for graph in graphs(proto.graph):  # onnx_ir writes initializers only as external data
        for tensor in graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = f"{folder}/{entry.value}"
    first = reading_copy(model)
    first.write_bytes(proto.SerializeToString())
    return first


def _stale_data(output: Path) -> list[str]:
    """Data files an earlier run may have left beside ``output`` (``OUT.onnx.data`` and its
    numbered chunks), removed once the new model, which does not use them, is in place."""
    single = data_path(output).name
    chunk = chunk_names(single)
    if chunk is None:
        return [single]  # pragma: no cover
    return [single, *sorted(p.name for p in output.parent.iterdir() if chunk.fullmatch(p.name))]


@contextlib.contextmanager
def _weights_by_reference(model: ir.Model, mapped: Sequence[MappedFile]) -> Iterator[str]:
    """Within the block, the model's initializers that lie in a mapped file (one of
    ``mapped``, or another found by :func:`file_ranges`) are
    :class:`onnx_ir.ExternalTensor`\\ s over it (the model is restored afterwards); yields
    how many (``12 of 14 tensors (0.52 GB) copied file to file``)."""
    def over_files(tensors: list) -> list:
        ranges = file_ranges([getattr(t, "raw", None) for t in tensors], mapped)
        return [by_reference(t, where) for t, where in zip(tensors, ranges)]

    with _swapped(model, over_files) as swapped:
        copied = [t for t in swapped  # the smaller ones stay in the model
                  if isinstance(t, ir.ExternalTensor) and t.nbytes > EXTERNAL_TENSOR_BYTES]
        yield (f"{len(copied)} of {len(swapped)} tensors "
               f"({sum(t.nbytes for t in copied) / 1e9:.2f} GB) copied file to file")


def _in_memory(tensors: list) -> list:
    """:class:`onnx_ir.ExternalTensor`\\ s (of a ``.onnx`` input) read into memory, to be
    embedded: ``ir.save`` would keep their location, relative to the input's folder."""
    return [ir.external_data.convert_tensors_from_external([t])[0]
            if isinstance(t, ir.ExternalTensor) else t for t in tensors]


@contextlib.contextmanager
def _swapped(model: ir.Model, convert: Callable[[list], list]) -> Iterator[list]:
    """Within the block, the initializers' tensors are ``convert(tensors)`` (yielded;
    restored after)."""
    values = initializers(model)
    tensors = [v.const_value for v in values]
    swapped = convert(tensors)
    for value, tensor in zip(values, swapped):
        value.const_value = tensor  # type: ignore[assignment]
    try:
        yield swapped
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor

def _staging(output: Path, early: EarlyData | None
             ) -> contextlib.AbstractContextManager[Path]:
    """The staging folder: the early data's (already locked and cleaned by its block), or a
    new one."""
    return contextlib.nullcontext(early.folder) if early is not None else staging_folder(output)


def _save_external(model: ir.Model, staged: Path, total: int, chunk: int | None,
                   progress: Progress, early: EarlyData | None,
                   mapped: Sequence[MappedFile]) -> str:
    """Tensors of ``EXTERNAL_TENSOR_BYTES`` or more go to the data file(s); smaller ones
    (shapes, axes, scalars: what shape inference reads) stay in the model. The model's
    weights written early are used when they are exactly those; else they are written now,
    file to file where they lie in a file. Returns the note on how (``146 of 156 tensors
    (2.47 GB) copied file to file``)."""
    start = time.perf_counter()
    places = early.placing([v.const_value for v in initializers(model)],  # type: ignore
                           EXTERNAL_TENSOR_BYTES) if early is not None else None
    if early is not None and places is not None:
        with _swapped(model, lambda ts: [by_reference(t, w) for t, w in zip(ts, places)]):
            ir.save(model, staged)  # the data is written: the model refers to it
        gb = early.nbytes / 1e9
        made = (f", {len(early.appended)} from memory appended "
                f"({sum(early.appended) / 1e6:.2f} MB)" if early.appended else "")
        return (f"weights: {gb:.2f} GB written while exporting, in {early.seconds:.1f}s "
                f"({gb / max(early.seconds, 1e-9):.2f} GB/s, synced; waited "
                f"{time.perf_counter() - start:.1f}s){made}; {early.placed} of "
                f"{len(places)} tensors ({gb:.2f} GB) copied file to file")
    with _weights_by_reference(model, mapped) as copied:
        ir.save(model, staged, external_data=data_path(staged).name,
                size_threshold_bytes=EXTERNAL_TENSOR_BYTES, max_shard_size_bytes=chunk,
                alignment=ALIGNMENT, callback=_byte_counter(total, progress),
                max_workers=WRITERS, max_in_flight_bytes=IN_FLIGHT_BYTES)
    seconds = time.perf_counter() - start
    return (f"weights: {total / 1e9:.2f} GB in {seconds:.1f}s "
            f"({total / 1e9 / max(seconds, 1e-9):.2f} GB/s); {copied}")


def _byte_counter(total: int, progress: Progress) -> Callable:
    """onnx_ir's per-tensor callback (called before each tensor is written) as progress."""
    done = 0

    def callback(tensor: ir.TensorProtocol, info: object) -> None:
        nonlocal done
        progress.transfer(done, total)
        done += tensor.nbytes
    return callback



def write_models(models: Sequence[tuple[Path, ir.Model, Callable[[Path], str] | None]], *,
                 progress: Progress = SILENT, beside: Beside = Beside()) -> Path:
    """Write ``models`` (path, model, check; all in one folder) with their weights in one data
    file, that of the last (``LAST.onnx.data``): a tensor the models share (the same bytes,
    under any name) is written once and each model refers to it. Each check runs on its
    staged model; they are published together, with ``beside`` (the others as companions of
    the last: :func:`rewrite.files.outputs.publish`). Returns the data file."""
    last = models[-1][0]
    data = data_path(last).name
    try:
        with staging_folder(last) as folder:
            with progress.step("writing weights"):
                places = _shared_data([model for _, model, _ in models], folder, data)
            for path, model, _ in models:
                with _swapped(model, lambda ts: [places.get(_identity(t), t) for t in ts]):
                    ir.save(model, folder / path.name)
            for path, _, check in models:
                if check is not None:
                    with progress.step(f"checking {path.name} against eager PyTorch"):
                        progress.note(check(folder / path.name))
            for companion in beside.files:
                companion.write(folder)
            first = _reading_folder(folder / last.name, folder.name)
            companions = (*(path.name for path, _, _ in models[:-1]),
                          *(c.name for c in beside.files))
            publish(last, Staged(folder, folder / last.name, first, (data,), companions),
                    stale=[*_stale_data(last), *beside.stale])
    except OSError as e:
        raise InputError(f"{last}: cannot write ({e.strerror or e})") from e
    return last.with_name(data)


def _identity(tensor: ir.TensorProtocol) -> tuple:
    """What tells one tensor's bytes from another's: a torch tensor's memory, shape and
    strides (tied weights are one tensor under two names), else the tensor object."""
    import torch

    raw = getattr(tensor, "raw", None)
    if isinstance(raw, torch.Tensor):
        return (raw.data_ptr(), raw.dtype, tuple(raw.shape), raw.stride())
    return (id(tensor),)


def _shared_data(models: Sequence[ir.Model], folder: Path, data: str
                 ) -> dict[tuple, ir.TensorProtocol]:
    """The tensors of ``models`` over ``EXTERNAL_TENSOR_BYTES`` written once each into
    ``folder / data``; identity (:func:`_identity`) -> the external tensor over its bytes."""
    unique: dict[tuple, ir.TensorProtocol] = {}
    for model in models:
        for value in initializers(model):
            tensor = value.const_value
            if tensor is not None and tensor.nbytes > EXTERNAL_TENSOR_BYTES:
                unique.setdefault(_identity(tensor), tensor)
    written = ir.external_data.convert_tensors_to_external(
        list(unique.values()), folder, data, alignment=ALIGNMENT)
    return dict(zip(unique, written))
