"""Several models reading one data file, each weight in it once.

Models made from one module at several static sizes (``rewrite export --static
seq=128,seq=1``) hold the same weights. The first is written as any model
(:func:`rewrite.backends.onnx.save.write_model`); each further one (a :class:`Sibling`)
refers to the first's bytes in its data file for every initializer equal to the first's of
its name (same dtype, shape and bytes: the same tensor, else compared), and what only it
holds is appended to the data file (aligned as onnx_ir aligns). Tensors of at most
``EXTERNAL_TENSOR_BYTES`` stay in each model, as in any.

A sibling is named ``OUT_seqS.onnx`` beside ``OUT.onnx`` (:func:`sibling_path`); one of an
earlier run that the new set does not rewrite, and that reads the output's data, is removed
when the new models are committed (:func:`stale_siblings`): the data it reads is replaced.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx.early_data import append_tensor

Place = tuple[str, int, int]
"""Where a tensor lies in a data file: (file name, offset, length)."""


@frozen(eq=False)
class Sibling:
    """A further model written beside the output, reading the output's data file."""

    model: ir.Model
    output: Path
    """Its file: in the output's folder (:func:`sibling_path`)."""
    check: Callable[[Path], str] | None = None
    """Run on its staged file before anything is published (its note is reported)."""


def sibling_path(output: Path, size: int) -> Path:
    """``OUT_seq{size}.onnx`` beside ``OUT.onnx``: the model of chunk length ``size``."""
    return output.with_name(f"{output.stem}_seq{size}{output.suffix}")


def stale_siblings(output: Path, data: set[str], keep: set[str]) -> list[str]:
    """The models ``OUT_seqS.onnx`` beside ``output`` that are not in ``keep`` and read one
    of the data files ``data`` (by name, in the folder or an earlier staging folder)."""
    pattern = re.compile(rf"{re.escape(output.stem)}_seq\d+{re.escape(output.suffix)}")
    found = []
    for path in sorted(output.parent.iterdir()):
        if pattern.fullmatch(path.name) and path.name not in keep and path.is_file():
            try:
                places = external_places(path)
            except Exception:  # not a readable model: not ours
                continue
            if {Path(location).name for location, _, _ in places.values()} & data:
                found.append(path.name)
    return found


def external_places(model: Path) -> dict[str, Place]:
    """Each initializer of the saved ``model`` that lies in a data file, by name."""
    proto = onnx.load(str(model), load_external_data=False)
    places = {}
    for graph in graphs(proto.graph):
        for tensor in graph.initializer:
            entries = {e.key: e.value for e in tensor.external_data}
            if "location" in entries:
                places[tensor.name] = (entries["location"], int(entries.get("offset", 0)),
                                       int(entries.get("length", 0)))
    return places


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and its subgraphs (``If`` branches, ``Loop`` / ``Scan`` bodies), nested."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from graphs(sub)


def save_sharing(model: ir.Model, staged: Path, first: ir.Model, first_staged: Path, *,
                 inline: int, alignment: int, default_data: str) -> None:
    """Save ``model`` at ``staged``, its initializers over ``inline`` bytes in the data of
    ``first`` (saved at ``first_staged``, in the same folder): those equal to the first's
    where they are, the others appended to its (last) data file, or to ``default_data``
    when it has none."""
    places = external_places(first_staged)
    theirs = {v.name: v.const_value for v in initializers(first)}
    target = max((location for location, _, _ in places.values()), default=default_data)
    values = [v for v in initializers(model) if v.const_value.nbytes > inline]  # type: ignore
    tensors = [v.const_value for v in values]
    for value, tensor in zip(values, tensors):
        assert tensor is not None and value.name is not None
        place = places.get(value.name)
        if place is None or not same_tensor(tensor, theirs.get(value.name)):
            place = (target, append_tensor(staged.parent / target, tensor, alignment),
                     tensor.nbytes)
        location, offset, length = place
        value.const_value = ir.ExternalTensor(  # type: ignore[assignment]
            location, offset, length, tensor.dtype, shape=tensor.shape, name=value.name,
            base_dir=str(staged.parent))
    try:
        ir.save(model, staged)
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor  # type: ignore[assignment]


def initializers(model: ir.Model) -> list[ir.Value]:
    """The initializers with a value, of the main graph and of every subgraph."""
    return [v for graph in model.graphs() for v in graph.initializers.values()
            if v.const_value is not None]


def same_tensor(a: ir.TensorProtocol, b: ir.TensorProtocol | None) -> bool:
    """Whether ``a`` and ``b`` hold the same dtype, shape and bytes (one torch tensor's
    storage is not read)."""
    if b is None or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a is b:
        return True
    raw_a, raw_b = getattr(a, "raw", None), getattr(b, "raw", None)
    if _same_storage(raw_a, raw_b):
        return True
    return a.nbytes == b.nbytes and np.array_equal(
        np.frombuffer(a.tobytes(), np.uint8), np.frombuffer(b.tobytes(), np.uint8))


def _same_storage(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are torch tensors over the same bytes."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is there when models are exported
        return False
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)
