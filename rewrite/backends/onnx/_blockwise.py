"""Blockwise 4-bit round-to-nearest quantization of one weight, computed when it is written.

A weight ``W`` of ``[K, N]`` (in, out: what ``MatMul(x, W)`` takes) becomes ``q`` (int4,
symmetric; uint4 with a zero point, asymmetric) of ``[K, N]``, and ``scale`` (and
``zero_point``) of ``[ceil(K / block), N]``: blocks of ``block`` consecutive values along K,
the layout ``DequantizeLinear(q, scale, zero_point, axis=0, block_size=block)`` reads and
onnxruntime fuses with the ``MatMul`` into ``MatMulNBits``. A last partial block (K not a
multiple of ``block``) is quantized as if padded with zeros; nothing is padded in the file.

The numbers are onnxruntime's (``MlasQuantizeBlockwise``, what the model builder's
``-p int4`` runs): symmetric, the scale is the block's value of largest magnitude over -8
(that value is exactly -8; the scale may be negative; of a positive and a negative value of
the same magnitude, the negative); asymmetric, the range ``[min(w, 0), max(w, 0)]`` over 15
levels, the zero point rounded. One difference: values are divided by the scale and rounded
half to even, where MLAS multiplies by the reciprocal and rounds half away from zero (on a
random bf16 weight of 16.7M values, 25,757 differ by one step). Computed with torch,
vectorized, in float32 whatever the weight's dtype (a bfloat16 weight is read as it is
mapped).

Each part is an :class:`onnx_ir.LazyTensor`: the source is read and quantized when the
first part is written (``q`` and the zero points packed two to a byte), and dropped once
every part has been read, so that writing a model holds one weight at a time
(:class:`Blockwise`). :func:`fake_quantized` is the weight the written model computes with
(its ``DequantizeLinear``), for an eager reference; :class:`Kept` keeps the quantized
weights written (packed, in their source's layout) for one, so that they are not computed
twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    import torch


class Blockwise:
    """The quantized parts of one weight, made on first read, freed after the last."""

    def __init__(self, source: Callable[[], Any], shape: tuple[int, int], *,
                 transposed: bool, block: int, symmetric: bool, scale_dtype: ir.DataType,
                 name: str, kept: "tuple[Kept, str] | None" = None) -> None:
        """``source``: the weight as stored (``[N, K]`` when ``transposed``, a Linear's
        layout; else ``[K, N]``; a torch tensor or an array), read only when written;
        ``kept``: where its quantized rows are also kept, and under which key."""
        self._source, self._transposed, self._kept = source, transposed, kept
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
        q, scale, zero_point = _in_slices(self._source(), self._transposed, self.block,
                                          self.symmetric)
        if self._kept is not None:
            self._kept[0].put(self._kept[1], q, scale, zero_point)
        parts: dict[str, ir.TensorProtocol] = {
            "q": _packed(q.T, self.q),
            "scale": ir.Tensor(_as(scale.T.contiguous().numpy(), self._scale_dtype),
                               dtype=self._scale_dtype, name=self.scale.name)}
        if zero_point is not None and self.zero_point is not None:
            parts["zero_point"] = _packed(zero_point.T, self.zero_point)
        return parts


def as_float32(weight: Any) -> "torch.Tensor":
    """``weight`` (a torch tensor or an array) as a float32 torch tensor, no copy if it is
    one."""
    import torch

    if not isinstance(weight, torch.Tensor):
        weight = torch.from_numpy(np.asarray(weight, dtype=np.float32))
    return weight.detach().to(torch.float32)


SLICE = 1 << 24
"""Values quantized at a time: a large weight (a vocabulary's head) is quantized a slice of
rows at a time, so that its float32 copies are of the slice."""


def _in_slices(source: Any, transposed: bool, block: int, symmetric: bool
               ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]:
    """:func:`quantize_rows` of the weight as stored (``[N, K]`` when ``transposed``, else
    ``[K, N]``), :data:`SLICE` values at a time."""
    import torch

    n, k = source.shape if transposed else source.shape[::-1]
    step = max(1, SLICE // max(k, 1))
    parts = []
    for start in range(0, n, step):
        part = source[start:start + step] if transposed else source[:, start:start + step].T
        parts.append(quantize_rows(as_float32(part).contiguous(), block, symmetric))
    if len(parts) == 1:
        return parts[0]
    q, scale, zero_point = zip(*parts)
    return (torch.cat(q), torch.cat(scale),
            None if zero_point[0] is None else torch.cat(zero_point))


def quantize_rows(rows: "torch.Tensor", block: int, symmetric: bool
                  ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]:
    """``rows`` ``[N, K]`` float32, blocks along K (the last dimension) -> (q ``[N, K]``:
    int8 in [-8, 7] or uint8 in [0, 15], scale ``[N, ceil(K/block)]`` float32, zero point
    (uint8, None when symmetric))."""
    import torch

    n, k = rows.shape
    blocks = -(-k // block)
    if blocks * block != k:
        rows = torch.nn.functional.pad(rows, (0, blocks * block - k))
    grouped = rows.reshape(n, blocks, block)
    if symmetric:
        high, low = grouped.amax(2), grouped.amin(2)
        scale = torch.where(high > -low, high, low).div_(-8.0)
        scale.masked_fill_(scale == 0, 1.0)
        q = (grouped / scale[..., None]).round_().clamp_(-8, 7).to(torch.int8)
        return q.view(n, -1)[:, :k], scale, None
    low = torch.clamp(grouped.amin(2), max=0.0)
    high = torch.clamp(grouped.amax(2), min=0.0)
    scale = (high - low) / 15.0
    scale = torch.where(scale == 0, 1.0, scale)
    zero_point = torch.clamp(torch.round(-low / scale), 0, 15)
    q = torch.clamp(torch.round(grouped / scale[..., None]) + zero_point[..., None], 0, 15)
    return q.to(torch.uint8).view(n, -1)[:, :k], scale, zero_point.to(torch.uint8)


def dequantize_rows(q: "torch.Tensor", scale: "torch.Tensor",
                    zero_point: "torch.Tensor | None", block: int) -> "torch.Tensor":
    """What ``DequantizeLinear`` computes from :func:`quantize_rows`' parts: ``[N, K]``
    (``q``: the integers, or their float32 values, which are overwritten)."""
    import torch

    n, k = q.shape
    blocks = scale.shape[1]
    values = q.to(torch.float32)
    if blocks * block != k:
        values = torch.nn.functional.pad(values, (0, blocks * block - k))
    values = values.view(n, blocks, block)
    if zero_point is not None:
        values.sub_(zero_point.to(torch.float32)[..., None])
    return values.mul_(scale[..., None]).view(n, -1)[:, :k]


def fake_quantized(weight: Any, layout: str, block: int, symmetric: bool) -> "torch.Tensor":
    """The float32 weight the written model computes with, in ``weight``'s own shape:
    ``layout`` ``"NK"``, a Linear's ``[out, in]`` (blocks along its last dimension);
    ``"KN"``, ``[in, out]`` (blocks along its first)."""
    rows = as_float32(weight)
    rows = rows if layout == "NK" else rows.T
    back = dequantize_rows(*quantize_rows(rows, block, symmetric), block)
    return back if layout == "NK" else back.T.contiguous()


def quantize(weight: np.ndarray, block: int, symmetric: bool
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``weight`` ``[K, N]`` float32 -> (q ``[K, N]``: int8 in [-8, 7] or uint8 in [0, 15],
    scale ``[ceil(K/block), N]``, zero point (uint8, None when symmetric)): numpy arrays."""
    q, scale, zero_point = quantize_rows(as_float32(weight).T, block, symmetric)
    return (q.T.contiguous().numpy(), scale.T.contiguous().numpy(),
            None if zero_point is None else zero_point.T.contiguous().numpy())


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
               block: int) -> np.ndarray:
    """What ``DequantizeLinear(q, scale, zero_point, axis=0, block_size=block)`` computes."""
    k = q.shape[0]
    scale_k = np.repeat(scale.astype(np.float32), block, axis=0)[:k]
    zero = 0 if zero_point is None else np.repeat(zero_point.astype(np.float32), block, 0)[:k]
    return (q.astype(np.float32) - zero) * scale_k


def _packed(values: "torch.Tensor", like: ir.LazyTensor) -> ir.PackedTensor:
    """4-bit ``values`` (int8 or uint8, any layout) packed two to a byte in row-major
    order, the first in the low nibble (ONNX's packing)."""

    return ir.PackedTensor(_pack(values).numpy(), like.dtype, shape=like.shape,
                           name=like.name)


def _pack(values: "torch.Tensor") -> "torch.Tensor":
    """4-bit ``values`` (int8 or uint8) packed two to a byte, row-major, the first in the low
    nibble: uint8, half as many (rounded up)."""
    import torch

    flat = values.contiguous().view(-1).view(torch.int8)
    if flat.numel() % 2:
        flat = torch.nn.functional.pad(flat, (0, 1))
    return ((flat[0::2] & 0xF) | (flat[1::2] << 4)).view(torch.uint8)


def _unpack(packed: "torch.Tensor", shape: tuple[int, int], signed: bool) -> "torch.Tensor":
    """:func:`_pack`'s inverse, as float32 values of ``shape`` (a table of each byte's two
    values, gathered a slice of bytes at a time)."""
    import torch

    codes = torch.arange(256)
    pairs = torch.stack([codes & 0xF, codes >> 4], dim=-1)
    if signed:
        pairs = pairs - ((pairs & 0x8) << 1)
    table = pairs.to(torch.float32)
    count = shape[0] * shape[1]
    values = torch.empty(2 * len(packed), dtype=torch.float32)
    step = 1 << 22
    for start in range(0, len(packed), step):
        chunk = packed[start:start + step].to(torch.int32)
        values[2 * start:2 * (start + len(chunk))] = \
            torch.nn.functional.embedding(chunk, table).view(-1)
    return values[:count].view(shape)


class Kept:
    """Quantized weights kept (rows packed two to a byte, scales, zero points) under a key,
    for :meth:`weight`: 0.6 bytes per value."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._parts

    def clear(self) -> None:
        self._parts.clear()

    def put(self, key: str, q: "torch.Tensor", scale: "torch.Tensor",
            zero_point: "torch.Tensor | None") -> None:
        self._parts[key] = (_pack(q), tuple(q.shape), scale, zero_point, q.dtype)

    def weight(self, key: str, layout: str, block: int) -> "torch.Tensor":
        """The float32 weight ``key``'s ``DequantizeLinear`` computes, in its source's
        layout (``"NK"``: the rows; ``"KN"``: transposed)."""
        import torch

        packed, shape, scale, zero_point, dtype = self._parts[key]
        q = _unpack(packed, shape, signed=dtype == torch.int8)
        back = dequantize_rows(q, scale, zero_point, block)
        return back if layout == "NK" else back.T.contiguous()


def _as(array: np.ndarray, dtype: ir.DataType) -> np.ndarray:
    """``array`` in the numpy type of ``dtype`` (bfloat16 through ml_dtypes)."""
    return array.astype(np.float32).astype(dtype.numpy())
