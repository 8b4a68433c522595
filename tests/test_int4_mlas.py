"""int4 weights bit for bit onnxruntime's: the 4-bit values, scales and zero points rewrite
writes are what onnxruntime's ``quantize_matmul_4bits`` (``MlasQuantizeBlockwise``, what
``MatMulNBitsQuantizer`` and so the model builder's ``-p int4`` run) makes of the same weight:
random weights of several shapes (rows not a multiple of the block, an odd count of
columns), blocks of zeros and of exact halves, bf16 / fp16 / fp32 sources, both symmetries,
as :class:`~rewrite.backends.onnx._blockwise.Blockwise` writes them and as an exported
model holds them."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnxruntime.capi._pybind_state import quantize_matmul_4bits
from safetensors.torch import load_file

import rewrite
from rewrite.backends.onnx._blockwise import Blockwise
from tests import checkpoints


def _onnxruntime(weight: np.ndarray, block: int, symmetric: bool
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's quantization of ``weight`` ``[K, N]`` (float32 or float16): (the
    packed bytes ``[N, blocks, block / 2]``, MatMulNBits' ``B``; the 4-bit values ``[K,
    N]`` unsigned, symmetric ones offset by 8; scales ``[blocks, N]``; zero points
    ``[blocks, N]``)."""
    weight = np.ascontiguousarray(weight)  # read as its bytes, whatever its strides
    k, n = weight.shape
    blocks = -(-k // block)
    packed = np.zeros((n, blocks, block // 2), np.uint8)
    zero_point = np.zeros((n, (blocks + 1) // 2), np.uint8)
    scale = np.zeros((n, blocks), weight.dtype)
    quantize_matmul_4bits(packed, weight, scale, zero_point, block, n, k, symmetric)
    values = np.stack([packed & 0xF, packed >> 4], -1).reshape(n, -1)[:, :k]
    zeros = np.stack([zero_point & 0xF, zero_point >> 4], -1).reshape(n, -1)[:, :blocks]
    return packed, values.T, scale.T, zeros.T


def _weight(shape: tuple[int, int], block: int, dtype: torch.dtype) -> torch.Tensor:
    """A Linear's weight ``[N, K]`` in ``dtype``: normal values, a block of zeros, a block of
    exact halves of its scale (ties) and one of a single repeated value."""
    n, k = shape
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(n * k)) * 0.05
    if n >= 4 and k >= block:
        weight[1, :block] = 0.0
        weight[2, :block] = torch.arange(block) % 17 * 0.5 - 4.0  # -8 * scale -0.5: ties
        weight[3, :block] = -0.3
    return weight.to(dtype)


SHAPES = [(64, 96), (7, 100), (33, 40), (1, 5), (16, 256)]
"""[N, K]: K a multiple of 32 or not, N odd or even, a single value."""


SOURCES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "fp16-scales": torch.float16}
"""A weight's dtype; ``fp16-scales``: a float16 model's weight (float16 scales, computed
from float16 as onnxruntime quantizes a float16 initializer); the others as the builder
quantizes for the CPU: the weight in float32."""


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_blockwise_parts_are_onnxruntimes(shape, block, symmetric):
    for source, dtype in SOURCES.items():
        weight = _weight(shape, block, dtype)
        half = source == "fp16-scales"
        scale_dtype = ir.DataType.FLOAT16 if half else ir.DataType.FLOAT
        expected = _onnxruntime(weight.T.numpy() if half else weight.float().T.numpy(),
                                block, symmetric)
        _assert_written(weight, block, symmetric, scale_dtype, expected)


def _assert_written(weight: torch.Tensor, block: int, symmetric: bool,
                    scale_dtype: ir.DataType, expected: tuple) -> None:
    """``weight``'s parts as :class:`Blockwise` writes them (from ``[N, K]`` and from ``[K,
    N]``; from two parts of its rows, as a packed weight's; an embedding's rows) are
    ``expected`` (:func:`_onnxruntime`'s)."""
    packed, values, scale, zeros = expected
    shape = tuple(weight.shape)
    for transposed in (True, False):  # a Linear's [N, K], or [K, N]
        parts = Blockwise(lambda t=transposed: weight if t else weight.T.contiguous(),
                          shape if transposed else shape[::-1], transposed=transposed,
                          block=block, symmetric=symmetric, scale_dtype=scale_dtype,
                          name="w")
        q = parts.q.numpy().astype(np.int16) + (8 if symmetric else 0)
        np.testing.assert_array_equal(q, values)
        assert parts.scale.numpy().tobytes() == scale.tobytes()
        if not symmetric:
            np.testing.assert_array_equal(parts.zero_point.numpy(), zeros)
    if shape[0] % 2 == 0 and shape[0] >= 4:  # a packed Linear's parts, quantized each alone
        cut = shape[0] // 2 - shape[0] // 2 % 2

        def whole() -> torch.Tensor:
            raise AssertionError("the parts were concatenated")

        parts = Blockwise(whole, shape, transposed=True, block=block, symmetric=symmetric,
                          scale_dtype=scale_dtype, name="w", parts=(weight[:cut], weight[cut:]))
        q = parts.q.numpy().astype(np.int16) + (8 if symmetric else 0)
        np.testing.assert_array_equal(q, values)
        assert parts.scale.numpy().tobytes() == scale.tobytes()
        if not symmetric:
            np.testing.assert_array_equal(parts.zero_point.numpy(), zeros)
    if shape[1] % block == 0:  # an embedding's rows: MatMulNBits' B, byte for byte
        rows = Blockwise(lambda: weight, shape, transposed=True, block=block,
                         symmetric=symmetric, scale_dtype=scale_dtype, name="w", rows=True)
        assert rows.q.numpy().tobytes() == packed.tobytes()
        assert rows.scale.numpy().tobytes() == np.ascontiguousarray(scale.T).tobytes()
        if not symmetric:
            np.testing.assert_array_equal(rows.zero_point.numpy(), zeros.T)


@pytest.mark.parametrize("symmetric", [
    True, pytest.param(False, marks=pytest.mark.slow)], ids=["symmetric", "asymmetric"])
def test_an_exported_model_holds_onnxruntimes_weights(symmetric, tmp_path):
    """Every weight of a tied bf16 Llama written in int4 (packed ones, the head, the
    table's rows; a down projection whose 48 rows are not a multiple of 32) is what
    onnxruntime's quantizer makes of the checkpoint's weight in float32."""
    folder = checkpoints.write("llama", tmp_path / "ckpt", dtype=torch.bfloat16,
                               tie_word_embeddings=True)
    out = tmp_path / "model.onnx"
    rewrite.export(folder, output=out, precision="int4", symmetric=symmetric)
    stored = load_file(folder / "model.safetensors")
    written = {t.name: onnx.numpy_helper.to_array(t)
               for t in onnx.load(str(out)).graph.initializer}
    checked = 0
    for name, q in written.items():
        if not name.endswith("_Q4G32"):
            continue
        base = name.removesuffix("_Q4G32").removesuffix("_rows")
        prefix, _, parts = base.removesuffix(".weight").rpartition(".")
        weight = torch.cat([stored[f"{prefix}.{part}.weight"] if prefix
                            else stored["model.embed_tokens.weight"]  # the tied head
                            for part in parts.split("+")])
        packed, values, scale, zeros = _onnxruntime(weight.float().T.numpy(), 32, symmetric)
        if name.endswith("_rows_Q4G32"):
            assert q.tobytes() == packed.tobytes(), name
            continue
        np.testing.assert_array_equal(q.astype(np.int16) + (8 if symmetric else 0), values,
                                      err_msg=name)
        assert written[f"{base}_scale"].tobytes() == scale.tobytes(), name
        if not symmetric:
            np.testing.assert_array_equal(written[f"{base}_zp"], zeros, err_msg=name)
        checked += 1
    assert checked == 4 * checkpoints.LAYERS + 1  # 4 per layer (2 packed) and the head
