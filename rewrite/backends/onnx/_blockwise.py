"""Blockwise 4-bit round-to-nearest quantization of one weight, computed when it is written.

A weight ``W`` of ``[K, N]`` (in, out: what ``MatMul(x, W)`` takes) becomes ``q`` (int4,
symmetric; uint4 with a zero point, asymmetric) of ``[K, N]``, and ``scale`` (and
``zero_point``) of ``[ceil(K / block), N]``: blocks of ``block`` consecutive values along K,
the layout ``DequantizeLinear(q, scale, zero_point, axis=0, block_size=block)`` reads and
onnxruntime fuses with the ``MatMul`` into ``MatMulNBits``. A last partial block (K not a
multiple of ``block``) is quantized as if padded with zeros; nothing is padded in the file.

The numbers are onnxruntime's (``MlasQuantizeBlockwise``, what the model builder's
``-p int4`` runs): symmetric, the scale is the block's value of largest magnitude over -8
(that value is exactly -8; the scale may be negative); asymmetric, the range ``[min(w, 0),
max(w, 0)]`` over 15 levels, the zero point rounded.

Each part is an :class:`onnx_ir.LazyTensor`: the source is read and quantized when the
first part is written, and dropped once every part has been read, so that writing a model
holds one weight at a time (:class:`Blockwise`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir


class Blockwise:
    """The quantized parts of one weight, made on first read, freed after the last."""

    def __init__(self, source: Callable[[], np.ndarray], shape: tuple[int, int], *,
                 transposed: bool, block: int, symmetric: bool, scale_dtype: ir.DataType,
                 name: str) -> None:
        """``source``: the weight as stored (``[N, K]`` when ``transposed``, a Linear's
        layout; else ``[K, N]``), read only when written."""
        self._source, self._transposed = source, transposed
        self.block, self.symmetric = block, symmetric
        k, n = (shape[1], shape[0]) if transposed else shape
        blocks = -(-k // block)
        self._scale_dtype = scale_dtype
        self._parts: dict[str, ir.TensorProtocol] | None = None
        self._unread: set[str] = set()
        q_type = ir.DataType.INT4 if symmetric else ir.DataType.UINT4
        self.q = self._lazy("q", q_type, (k, n), f"{name}_Q4G{block}")
        self.scale = self._lazy("scale", scale_dtype, (blocks, n), f"{name}_scale")
        self.zero_point = None if symmetric else self._lazy(
            "zero_point", ir.DataType.UINT4, (blocks, n), f"{name}_zp")

    def _lazy(self, part: str, dtype: ir.DataType, shape: tuple[int, int], name: str
              ) -> ir.LazyTensor:
        return ir.LazyTensor(lambda: self._read(part), dtype, ir.Shape(shape), name=name)

    def _read(self, part: str) -> ir.TensorProtocol:
        if self._parts is None:
            self._parts = self._quantize()
            self._unread = set(self._parts)
        tensor = self._parts[part]
        self._unread.discard(part)
        if not self._unread:
            self._parts = None  # every part read: free the weight's memory
        return tensor

    def _quantize(self) -> dict[str, ir.TensorProtocol]:
        weight = np.asarray(self._source(), dtype=np.float32)
        if self._transposed:
            weight = weight.T
        q, scale, zero_point = quantize(weight, self.block, self.symmetric)
        parts: dict[str, ir.TensorProtocol] = {
            "q": ir.Tensor(q, dtype=self.q.dtype, name=self.q.name),
            "scale": ir.Tensor(_as(scale, self._scale_dtype), dtype=self._scale_dtype,
                               name=self.scale.name)}
        if zero_point is not None and self.zero_point is not None:
            parts["zero_point"] = ir.Tensor(zero_point, dtype=ir.DataType.UINT4,
                                            name=self.zero_point.name)
        return parts


def quantize(weight: np.ndarray, block: int, symmetric: bool
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``weight`` ``[K, N]`` float32 -> (q ``[K, N]``: int8 in [-8, 7] or uint8 in [0, 15],
    scale ``[ceil(K/block), N]``, zero point (uint8, None when symmetric))."""
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = weight
    grouped = padded.reshape(blocks, block, n)
    if symmetric:
        largest = np.take_along_axis(grouped, np.abs(grouped).argmax(1)[:, None], 1)[:, 0]
        scale = largest / -8.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(grouped / scale[:, None]), -8, 7).astype(np.int8)
        return q.reshape(-1, n)[:k], scale, None
    low = np.minimum(grouped.min(1), 0.0)
    high = np.maximum(grouped.max(1), 0.0)
    scale = (high - low) / 15.0
    scale[scale == 0] = 1.0
    zero_point = np.clip(np.rint(-low / scale), 0, 15)
    q = np.clip(np.rint(grouped / scale[:, None]) + zero_point[:, None], 0, 15)
    return q.astype(np.uint8).reshape(-1, n)[:k], scale, zero_point.astype(np.uint8)


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
               block: int) -> np.ndarray:
    """What ``DequantizeLinear(q, scale, zero_point, axis=0, block_size=block)`` computes."""
    k = q.shape[0]
    scale_k = np.repeat(scale.astype(np.float32), block, axis=0)[:k]
    zero = 0 if zero_point is None else np.repeat(zero_point.astype(np.float32), block, 0)[:k]
    return (q.astype(np.float32) - zero) * scale_k


def _as(array: np.ndarray, dtype: ir.DataType) -> np.ndarray:
    """``array`` in the numpy type of ``dtype`` (bfloat16 through ml_dtypes)."""
    return array.astype(np.float32).astype(dtype.numpy())
