"""A weight made of several weights concatenated when it is written (:class:`PackedWeight`).

``finishing._pack`` writes a layer's query, key and value projections (and an MLP's gate
and up) as one ``MatMul`` by their weights concatenated along the output dimension: the
main graph's initializer for each call is a :class:`PackedWeight` of the initializers it
replaces, which reads them only when it is written (one packed weight in memory at a time).
It records its parts, so that a writer holding the weights elsewhere (the int4 export's
sources) concatenates those instead (:meth:`PackedWeight.rows`), or takes them one by one
(:meth:`PackedWeight.stacked`: the int4 writer quantizes each part's rows on their own).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np
import onnx_ir as ir
from attrs import frozen


class PackedWeight(ir.LazyTensor):
    """``parts`` (2-D tensors of one dtype, the initializers ``names``) concatenated along
    ``axis`` when read; ``sizes``: each part's extent along it."""

    def __init__(self, names: Sequence[str], parts: Sequence[ir.TensorProtocol], axis: int,
                 name: str) -> None:
        shapes = [tuple(part.shape) for part in parts]
        total = sum(shape[axis] for shape in shapes)
        shape = (total, shapes[0][1]) if axis == 0 else (shapes[0][0], total)
        self.names, self.axis = tuple(names), axis
        self.sizes = tuple(shape[axis] for shape in shapes)
        self.parts = tuple(parts)
        super().__init__(lambda: concatenated(self.parts, axis, name), parts[0].dtype,
                         ir.Shape(shape), name=name)

    def bounds(self) -> dict[str, tuple[int, int]]:
        """Each part's name -> its ``(start, stop)`` along ``axis``."""
        found, start = {}, 0
        for name, size in zip(self.names, self.sizes):
            found[name] = (start, start + size)
            start += size
        return found

    def rows(self, sources: Sequence[Any]) -> Any:
        """``sources`` (one torch tensor per part, in ``names``' order) concatenated
        like the parts."""
        return self.stacked(sources)()

    def stacked(self, sources: Sequence[Any]) -> "Stacked":
        """``sources`` (one torch tensor per part, in ``names``' order) to be concatenated
        like the parts when called."""
        return Stacked(tuple(sources), self.axis)


@frozen
class Stacked:
    """A packed weight's sources, one per part: called, concatenated along ``axis``."""

    parts: tuple
    axis: int

    def __call__(self) -> Any:
        import torch

        return torch.cat(list(self.parts), dim=self.axis)


def concatenated(parts: Sequence[ir.TensorProtocol], axis: int, name: str
                 ) -> ir.TensorProtocol:
    """``parts`` concatenated along ``axis``: with torch where they wrap torch tensors (no
    conversion of a bfloat16 weight), else with numpy."""
    torch = sys.modules.get("torch")
    raws = [getattr(part, "raw", None) for part in parts]
    if torch is not None and all(isinstance(raw, torch.Tensor) for raw in raws):
        from onnx_ir.tensor_adapters import TorchTensor

        return TorchTensor(torch.cat(raws, dim=axis), name=name)
    return ir.Tensor(np.concatenate([part.numpy() for part in parts], axis=axis), name=name)
