"""Blockwise 4-bit round-to-nearest quantization of one weight, computed when it is written.

A weight ``W`` of ``[K, N]`` (in, out: what ``MatMul(x, W)`` takes) becomes ``q`` (int4,
symmetric; uint4 with a zero point, asymmetric) of ``[K, N]``, and ``scale`` (and
``zero_point``) of ``[ceil(K / block), N]``: blocks of ``block`` consecutive values along K,
the layout ``DequantizeLinear(q, scale, zero_point, axis=0, block_size=block)`` reads and
onnxruntime fuses with the ``MatMul`` into ``MatMulNBits``. A last partial block (K not a
multiple of ``block``) is quantized as if padded with zeros; nothing is padded in the file.

The numbers are onnxruntime's, bit for bit (``MlasQuantizeBlockwise``, what its
``MatMulNBitsQuantizer`` and so the model builder's ``-p int4`` run): symmetric, the scale
is the block's value of largest magnitude over -8 (that value is exactly -8; the scale may be
negative; of a positive and a negative value of the same magnitude, the negative);
asymmetric, the range ``[min(w, 0), max(w, 0)]`` over 15 levels, the zero point ``-min /
scale`` rounded half away from zero; a block of zeros has a scale of 0. Each value is
multiplied by the reciprocal of its scale, the zero point (8, symmetric) added, then rounded
half away from zero (C's ``roundf``) into [0, 15] (symmetric values then less 8); a float16
model's weight is quantized with its float16 scale (onnxruntime's ``MLFloat16`` blocks), a
bfloat16 one as float32 (onnxruntime converts it). Computed with torch on one thread, in
float32 whatever the weight's dtype (a bfloat16 weight is read as it is mapped),
:data:`CHUNK` values at a time (each chunk converted, reduced, scaled and rounded while it
is in the processor's cache); pairs of rows are packed to bytes, then transposed once to the
file's ``[K, N]`` layout (:func:`_row_pairs`, :func:`_packed`).

Each part is an :class:`onnx_ir.LazyTensor`: the source is read and quantized when the
first part is written (``q`` and the zero points packed two to a byte), and dropped once
every part has been read, so that writing a model holds one weight at a time
(:class:`Blockwise`). :func:`fake_quantized` is the weight the written model computes with
(its ``DequantizeLinear``), for an eager reference; :class:`Kept` keeps the quantized
weights written (their pairs of rows packed, in their source's layout) for one, so that they
are not computed twice.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    import torch


class Blockwise:
    """The quantized parts of one weight, made on first read, each freed once read."""

    def __init__(self, source: Callable[[], Any], shape: tuple[int, int], *,
                 transposed: bool, block: int, symmetric: bool, scale_dtype: ir.DataType,
                 name: str, kept: "tuple[Kept, str] | None" = None, rows: bool = False,
                 parts: "tuple[torch.Tensor, ...] | None" = None) -> None:
        """``source``: the weight as stored (``[N, K]`` when ``transposed``, a Linear's
        layout; else ``[K, N]``; a torch tensor or an array), read only when written;
        ``kept``: where its quantized rows are also kept, and under which key; ``rows``:
        an embedding's table ``[N, K]`` (``transposed``) written by rows for ``Gather``
        (:func:`_by_rows`); ``parts``: the sources ``[N_i, K]`` whose rows, one after another,
        are the weight's (``transposed``: a packed Linear's), each quantized on its own when
        every one has an even count of rows (each row's blocks are its own: the same
        numbers, without the weight concatenated in float)."""
        self._source, self._transposed, self._kept = source, transposed, kept
        even = parts is not None and all(part.shape[0] % 2 == 0 for part in parts)
        self._row_parts = parts if even and transposed and not rows else None
        self.block, self.symmetric, self._rows = block, symmetric, rows
        k, n = (shape[1], shape[0]) if transposed else shape
        blocks = -(-k // block)
        self._scale_dtype = scale_dtype
        self._parts: dict[str, ir.TensorProtocol] | None = None
        self._lock = threading.Lock()  # parts may be written by concurrent writers
        q_type = ir.DataType.INT4 if symmetric else ir.DataType.UINT4
        shapes = ((n, blocks, block // 2), (n, blocks)) if rows else ((k, n), (blocks, n))
        self.q = self._lazy("q", ir.DataType.UINT8 if rows else q_type, shapes[0],
                            f"{name}_Q4G{block}")
        self.scale = self._lazy("scale", scale_dtype, shapes[1], f"{name}_scale")
        self.zero_point = None if symmetric else self._lazy(
            "zero_point", ir.DataType.UINT8 if rows else ir.DataType.UINT4, shapes[1],
            f"{name}_zp")

    def _lazy(self, part: str, dtype: ir.DataType, shape: tuple[int, int], name: str
              ) -> ir.LazyTensor:
        return ir.LazyTensor(lambda: self._read(part), dtype, ir.Shape(shape), name=name)

    def _read(self, part: str) -> ir.TensorProtocol:
        with self._lock:
            if self._parts is None or part not in self._parts:  # first read, or read again
                with one_thread() as workers:
                    self._parts = self._quantize(workers)
            tensor = self._parts.pop(part)  # each part's memory freed once it is read
            if not self._parts:
                self._parts = None
            return tensor

    def _quantize(self, workers: int) -> dict[str, ir.TensorProtocol]:
        q, pairs, scale, zero_point = self._quantized(workers)
        if self._kept is not None:
            self._kept[0].put(self._kept[1], pairs, scale.shape[0], scale, zero_point)
        if self._rows:
            return _by_rows(q, scale, zero_point, self)
        parts: dict[str, ir.TensorProtocol] = {
            "q": _packed(q, pairs, self.q),  # q: None where the rows are paired
            "scale": ir.Tensor(_as(scale.T.contiguous().numpy(), self._scale_dtype),
                               dtype=self._scale_dtype, name=self.scale.name)}
        if zero_point is not None and self.zero_point is not None:
            parts["zero_point"] = _packed(zero_point, _row_pairs(zero_point),
                                          self.zero_point)
        return parts

    def _quantized(self, workers: int) -> tuple:
        """``(q, pairs, scale, zero_point)`` (:func:`quantize_rows`, pairs: :func:`_row_pairs`
        of q); q None where made from the parts', which hold pairs of rows."""
        import torch

        half = self._scale_dtype == ir.DataType.FLOAT16
        if self._row_parts is not None:
            made = [quantize_rows(part.detach(), self.block, self.symmetric, workers=workers,
                                  half_scale=half) for part in self._row_parts]
            zero_points = [z for _, _, z in made]
            return (None, torch.cat([_row_pairs(q) for q, _, _ in made]),
                    torch.cat([scale for _, scale, _ in made]),
                    None if zero_points[0] is None else torch.cat(zero_points))
        source = self._source()
        source = source.detach() if isinstance(source, torch.Tensor) else as_float32(source)
        q, scale, zero_point = quantize_rows(
            source if self._transposed else source.T, self.block, self.symmetric,
            workers=workers, half_scale=half)
        return q, _row_pairs(q), scale, zero_point


def _by_rows(q: "torch.Tensor", scale: "torch.Tensor", zero_point: "torch.Tensor | None",
             like: Blockwise) -> dict[str, ir.TensorProtocol]:
    """An embedding's parts, ``[N, ...]`` as its table (``K`` whole blocks): ``q`` two
    values to a byte along each row, ``[N, blocks, block / 2]`` (uint8, the first in the
    low nibble; symmetric values offset by 8, so that each nibble is unsigned), ``scale``
    and the zero points (uint8) ``[N, blocks]``: what ``Gather`` takes (it takes no 4-bit
    type) and what the rows gathered are dequantized from (``(nibble - zero point or 8) *
    scale``); also, symmetric, what onnxruntime's ``MatMulNBits`` reads as its ``B``."""
    codes = q if zero_point is not None else q.add(8)
    parts: dict[str, ir.TensorProtocol] = {
        "q": ir.Tensor(_pack(codes).numpy().reshape(tuple(like.q.shape)), name=like.q.name),
        "scale": ir.Tensor(_as(scale.numpy(), like.scale.dtype), dtype=like.scale.dtype,
                           name=like.scale.name)}
    if zero_point is not None and like.zero_point is not None:
        parts["zero_point"] = ir.Tensor(zero_point.numpy(), name=like.zero_point.name)
    return parts


def made(source: Any) -> Any:
    """A weight's ``source`` as it is, or what it makes when it is a function (a packed
    weight's parts concatenated when it is written)."""
    return source() if callable(source) else source


def weight_values(tensor: ir.TensorProtocol, source: Any = None) -> Any:
    """A weight's values: what its ``source`` is or makes (:func:`made`), or without one
    the tensor's own: the torch tensor it wraps (no copy; torch.onnx's initializers), else
    its array."""
    if source is not None:
        return made(source)
    torch = sys.modules.get("torch")
    raw = getattr(tensor, "raw", None)
    return raw if torch is not None and isinstance(raw, torch.Tensor) else tensor.numpy()


def as_float32(weight: Any) -> "torch.Tensor":
    """``weight`` (a torch tensor or an array) as a float32 torch tensor, no copy if it is
    one."""
    import torch

    if not isinstance(weight, torch.Tensor):
        weight = torch.from_numpy(np.asarray(weight, dtype=np.float32))
    return weight.detach().to(torch.float32)


CHUNK = 1 << 18
"""Values quantized at a time: each chunk of rows is converted to float32 and quantized in
place while it is in the processor's cache; only the 4-bit results are kept."""


def quantize_rows(rows: "torch.Tensor", block: int, symmetric: bool, *,
                  workers: int | None = None, half_scale: bool = False
                  ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]:
    """``rows`` ``[N, K]`` (any floating dtype, any strides, never modified), blocks along
    K (the last dimension) -> (q ``[N, K]``: int8 in [-8, 7] or uint8 in [0, 15], scale
    ``[N, ceil(K/block)]`` float32, float16's values when ``half_scale``, zero point
    (uint8, None when symmetric)); :data:`CHUNK` values at a time, shared by ``workers``
    threads (torch's, by default)."""
    import torch

    n, k = rows.shape
    blocks = -(-k // block)
    q = torch.empty(n, k, dtype=torch.int8 if symmetric else torch.uint8)
    scale = torch.empty(n, blocks)
    zero_point = None if symmetric else torch.empty(n, blocks, dtype=torch.uint8)
    step = max(1, CHUNK // (blocks * block))
    with one_thread() as threads:
        spread(n, step, partial(_quantize_chunk, rows, q, scale, zero_point, block,
                                half_scale), workers or threads)
    return q, scale, zero_point


def _quantize_chunk(rows: "torch.Tensor", q: "torch.Tensor", scale: "torch.Tensor",
                    zero_point: "torch.Tensor | None", block: int, half_scale: bool,
                    start: int, stop: int) -> None:
    """:func:`quantize_rows`' rows ``start:stop`` into ``q``, ``scale`` and
    ``zero_point``, through a float32 copy of a cache's size."""
    import torch

    k = rows.shape[1]
    blocks = scale.shape[1]
    part = torch.empty(stop - start, blocks * block)
    part[:, :k].copy_(rows[start:stop])
    if blocks * block != k:
        part[:, k:].zero_()  # the last block as if padded with zeros
    scale[start:stop] = _quantize_in_place(
        part.view(stop - start, blocks, block),
        None if zero_point is None else zero_point[start:stop], half_scale)
    q[start:stop] = part[:, :k]


def spread(count: int, step: int, work: Callable[[int, int], None], workers: int) -> None:
    """``work(start, stop)`` over ``range(count)`` in steps of ``step``, the steps shared
    by ``workers`` threads (each a torch op at a time on one thread, the GIL released while
    it runs); ``work`` writes disjoint slices. The first error is raised."""
    starts = range(0, count, step)
    workers = max(1, min(workers, len(starts)))

    def run(offset: int) -> None:
        for start in starts[offset::workers]:
            work(start, min(start + step, count))

    if workers == 1:
        run(0)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="rewrite-int4") as pool:
        for done in [pool.submit(run, offset) for offset in range(workers)]:
            done.result()


class _Threads:
    """What the blocks under :func:`one_thread` share, in any thread: how many run, and
    torch's thread count before the first of them."""

    lock = threading.Lock()
    users = 0
    before = 0


@contextlib.contextmanager
def one_thread() -> Iterator[int]:
    """torch on one thread per op while the block runs, which gets the count torch had (the
    workers :func:`spread` shares chunks between): chunks of a cache's size are too small to
    share between torch's threads (on a loaded machine 2 threads took 3-5x 1 thread's
    time), not between threads of their own. Blocks may overlap in several threads (weights
    written concurrently): the count is restored when the last ends."""
    import torch

    with _Threads.lock:
        if not _Threads.users:
            _Threads.before = torch.get_num_threads()
            torch.set_num_threads(1)
        _Threads.users += 1
        threads = _Threads.before
    try:
        yield threads
    finally:
        with _Threads.lock:
            _Threads.users -= 1
            if not _Threads.users:
                torch.set_num_threads(_Threads.before)


def _quantize_in_place(grouped: "torch.Tensor", zero_point: "torch.Tensor | None",
                       half_scale: bool = False) -> "torch.Tensor":
    """``grouped`` ``[rows, blocks, block]`` float32 replaced by its 4-bit values (as
    floats; symmetric, signed), as ``MlasQuantizeBlockwise`` computes them (module
    docstring); its scales returned (float16's values when ``half_scale``: a float16
    weight is quantized with its float16 scale), its zero points written to
    ``zero_point`` (asymmetric)."""
    import torch

    low, high = torch.aminmax(grouped, dim=2)
    if zero_point is None:
        scale = torch.where(high > -low, high, low).div_(-8.0)
        zeros = torch.full_like(scale, 8.0)
    else:
        low.clamp_(max=0.0)
        high.clamp_(min=0.0)
        scale = (high - low).div_(15.0)  # 0: a block of zeros, whose values are 0 anyway
        zeros = _round_half_up(low.neg_().div_(scale.where(scale != 0, 1.0)).clamp_(0, 15))
        zero_point.copy_(zeros)
    if half_scale:
        scale = scale.to(torch.float16).to(torch.float32)
    reciprocal = scale.reciprocal().masked_fill_(scale == 0, 0.0)
    grouped.mul_(reciprocal[..., None]).add_(zeros[..., None]).clamp_(0, 15)
    _round_half_up(grouped, -8.0 if zero_point is None else 0.0)  # symmetric: signed
    return scale


def _round_half_up(values: "torch.Tensor", plus: float = 0.0) -> "torch.Tensor":
    """``values`` (float32, at least 0, less than 2 ** 22) rounded half up (C's
    ``roundf``), plus ``plus``, in place: ``floor(x - 0.5) + 1``, where ``x - 0.5`` is
    exact (``floor(x + 0.5)`` is not: 0.49999997 + 0.5 rounds to 1)."""
    return values.sub_(0.5).floor_().add_(1.0 + plus)


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


def _packed(rows: "torch.Tensor | None", pairs: "torch.Tensor", like: ir.LazyTensor
            ) -> ir.PackedTensor:
    """4-bit rows ``[N, K]`` (int8 or uint8; ``pairs``: :func:`_row_pairs` of them;
    ``rows`` needed for an odd N only) written transposed, ``[K, N]``, packed two to a byte
    in row-major order, the first in the low nibble (ONNX's packing): for an even N, the
    pairs of rows transposed."""
    if rows is None or rows.shape[0] % 2 == 0:
        data = pairs.T.contiguous()
    else:
        data = _pack(rows.T)
    return ir.PackedTensor(data.numpy().reshape(-1), like.dtype, shape=like.shape,
                           name=like.name)


def _row_pairs(rows: "torch.Tensor") -> "torch.Tensor":
    """4-bit ``rows`` ``[N, K]`` (int8 or uint8) packed two rows to a row of bytes: row
    ``2i`` in the low nibbles of row ``i``, row ``2i + 1`` in the high ones (a zero row
    added to an odd N): uint8 ``[ceil(N / 2), K]``."""
    import torch

    if rows.shape[0] % 2:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, 1))
    pairs = rows.view(torch.int8).view(-1, 2, rows.shape[1])
    return ((pairs[:, 0] & 0xF) | (pairs[:, 1] << 4)).view(torch.uint8)


def _pack(values: "torch.Tensor") -> "torch.Tensor":
    """4-bit ``values`` (int8 or uint8) packed two to a byte, row-major, the first in the low
    nibble: uint8, half as many (rounded up)."""
    import torch

    flat = values.contiguous().view(-1).view(torch.int8)
    if flat.numel() % 2:
        flat = torch.nn.functional.pad(flat, (0, 1))
    return ((flat[0::2] & 0xF) | (flat[1::2] << 4)).view(torch.uint8)


def _unpair(pairs: "torch.Tensor", rows: int, signed: bool) -> "torch.Tensor":
    """:func:`_row_pairs`' inverse: the first ``rows`` rows as float32 values (int4 when
    ``signed``, else uint4)."""
    import torch

    half, k = pairs.shape
    values = torch.empty(half, 2, k)
    if signed:
        codes = pairs.view(torch.int8)
        values[:, 0] = (codes << 4) >> 4
        values[:, 1] = codes >> 4
    else:
        values[:, 0] = pairs & 0xF
        values[:, 1] = pairs >> 4
    return values.view(2 * half, k)[:rows]


class Kept:
    """Quantized weights kept (pairs of rows packed to bytes, scales, zero points) under a
    key, for :meth:`weight`: 0.6 bytes per value."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._parts

    def clear(self) -> None:
        self._parts.clear()

    def put(self, key: str, pairs: "torch.Tensor", rows: int, scale: "torch.Tensor",
            zero_point: "torch.Tensor | None") -> None:
        """``pairs``: :func:`_row_pairs` of the ``rows`` rows of q (``[N, K]``)."""
        self._parts[key] = (pairs, rows, scale, zero_point)

    def weight(self, key: str, layout: str, block: int, out: "torch.Tensor | None" = None,
               rows: "tuple[int, int] | None" = None) -> "torch.Tensor":
        """The float32 weight ``key``'s ``DequantizeLinear`` computes, in its source's
        layout (``"NK"``: the rows; ``"KN"``: transposed), in ``out`` when given; only its
        ``rows`` (``(start, stop)``, start even, layout ``"NK"``) when given."""
        import torch

        pairs, count, scale, zero_point = self._parts[key]
        first, last = (0, count) if rows is None else rows
        if out is None:
            out = torch.empty((last - first, pairs.shape[1]) if layout == "NK"
                              else (pairs.shape[1], count))
        back = out if layout == "NK" else out.T
        step = max(2, CHUNK // max(pairs.shape[1], 1) // 2 * 2)  # an even count of rows

        def chunk(start: int, stop: int) -> None:  # a chunk of rows at a time, cache-hot
            low, high = first + start, first + stop  # the weight's rows; ``out``'s start:stop
            q = _unpair(pairs[low // 2:(high + 1) // 2], high - low, signed=zero_point is None)
            back[start:stop] = dequantize_rows(
                q, scale[low:high], None if zero_point is None else zero_point[low:high], block)

        with one_thread() as threads:
            spread(last - first, step, chunk, threads)
        return out

    def rows(self, key: str, ids: "torch.Tensor", block: int) -> "torch.Tensor":
        """Rows ``ids`` (any shape) of the float32 weight ``key``'s ``DequantizeLinear``
        computes (``"NK"``: a Linear's or an embedding's ``[N, K]``), only those
        dequantized: ``[*ids.shape, K]``."""
        import torch

        pairs, _, scale, zero_point = self._parts[key]
        flat = ids.reshape(-1)
        both = _unpair(pairs[flat // 2], 2 * len(flat), signed=zero_point is None)
        q = both.view(len(flat), 2, -1)[torch.arange(len(flat)), flat % 2]
        back = dequantize_rows(q, scale[flat],
                               None if zero_point is None else zero_point[flat], block)
        return back.reshape(*ids.shape, back.shape[-1])


def _as(array: np.ndarray, dtype: ir.DataType) -> np.ndarray:
    """``array`` in the numpy type of ``dtype`` (bfloat16 through ml_dtypes)."""
    return array.astype(np.float32).astype(dtype.numpy())
