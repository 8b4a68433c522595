"""``rewrite export --precision fp32|fp16|bf16|int4 [--block-size B] [--asymmetric]``.

``fp16``, ``bf16``: the model is built by transformers in that dtype (weights and compute; a
dtype other than the checkpoint's is a converted copy in memory, not a mapping), then
exported as it is. ``fp32``: the same for a float32 checkpoint; another is built as stored,
its linear layers' and embeddings' weights converted one at a time as they are written and
while the check runs, never a float32 copy of the model (:mod:`rewrite.exporting.int4`).
``int4``: the model computes in float32 (what the builder's ``-p
int4 -e cpu`` computes in), and before it is written the weights of every ``MatMul`` (every
linear of the decoder layers, and the lm_head, as onnxruntime-genai's builder does by
default; a tied embedding's table too, by rows, an untied one stays float, as there) become
blockwise 4-bit
(:mod:`rewrite.backends.onnx.quantize`), each computed from the checkpoint's mapped weight
as it is written, without a float32 copy of the model (:mod:`rewrite.exporting.int4`).

The int4 model written is checked against eager PyTorch run on the same weights quantized
and dequantized, with float32's tolerance; its error against eager float32 is reported
(:mod:`rewrite.exporting.int4`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from attrs import frozen

from rewrite.errors import InputError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from rewrite.exporting.checkpoint.folder import Checkpoint
    from rewrite.exporting.int4 import ShellExport
    from rewrite.exporting.verify import Check

PRECISIONS = ("fp32", "fp16", "bf16", "int4")
TARGETS = ("onnx", "onnxruntime")
BLOCK_SIZES = (16, 32, 64, 128, 256)
"""onnxruntime's ``MatMulNBits`` block sizes (powers of two from 16)."""
@frozen
class Precision:
    """What ``--precision`` asks for."""

    name: str | None
    """One of :data:`PRECISIONS`; None: the checkpoint's dtype."""
    block: int = 32
    symmetric: bool = True
    target: str = "onnx"
    """``"onnx"`` (standard ops) or ``"onnxruntime"``: onnxruntime's fused ops in the layer
    bodies (:func:`onnxruntime_ops`) and, in int4, a tied head
    reading its embedding's 4-bit table with ``com.microsoft.MatMulNBits``."""

    @classmethod
    def parse(cls, name: str | None, block: int | None, symmetric: bool | None,
              target: str | None = None) -> "Precision":
        """Checked options (InputError: one line)."""
        if name is not None and name not in PRECISIONS:
            raise InputError(f"precision={name!r}: expected one of {', '.join(PRECISIONS)}")
        if target is not None and target not in TARGETS:
            raise InputError(f"target={target!r}: expected one of {', '.join(TARGETS)}")
        if name != "int4" and (block is not None or symmetric is not None):
            raise InputError("--block-size and --asymmetric set the int4 quantization: they "
                             "go with --precision int4")
        block = 32 if block is None else block
        if block not in BLOCK_SIZES:
            raise InputError(f"--block-size {block}: expected one of "
                             f"{', '.join(map(str, BLOCK_SIZES))} (onnxruntime's MatMulNBits)")
        return cls(name, block, True if symmetric is None else symmetric, target or "onnx")

    @property
    def quantized(self) -> bool:
        return self.name == "int4"

    def dtype(self) -> "torch.dtype | str":
        """The dtype transformers builds the model in (``"auto"``: the checkpoint's)."""
        import torch

        return {None: "auto", "fp32": "auto", "int4": "auto",
                "fp16": torch.float16, "bf16": torch.bfloat16}[self.name]

    def start(self, model: "torch.nn.Module", report: Callable[[str], None], verify: bool
              ) -> "ShellExport | None":
        """The int4 export of ``model``, or its fp32 export when it is built in another
        dtype (its float32 shell made now: :mod:`rewrite.exporting.int4`); else None."""
        if self.name not in ("int4", "fp32"):
            return None
        from rewrite.exporting.int4 import ShellExport

        export = ShellExport(model, block=self.block if self.quantized else None,
                             symmetric=self.symmetric, report=report, verify=verify,
                             target=self.target)
        return export if self.quantized or export.sources else None


def checked(int4: "ShellExport | None", make: "Callable[[], Check | None] | None"
            ) -> "Callable[[Path], str] | None":
    """The check of a written model: ``make``'s, or (a shell's: int4, converted fp32)
    against eager on the same weights (:meth:`rewrite.exporting.int4.ShellExport.check`);
    None: not checked."""
    if make is None:
        return None
    return make() if int4 is None else int4.check(make)


QUANTIZERS = {"gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "fp8": "fp8",
              "compressed-tensors": "compressed-tensors"}


def refuse_quantized(checkpoint: "Checkpoint") -> None:
    """InputError for a checkpoint whose weights are already quantized."""
    config = checkpoint.config.get("quantization_config")
    if config is None:
        return
    method = str(config.get("quant_method", "")) if isinstance(config, dict) else ""
    name = QUANTIZERS.get(method.lower(), method or "unknown method")
    raise InputError(f"{checkpoint.path}: already quantized ({name}, quantization_config in "
                     "config.json); rewrite export takes float checkpoints (fp32, fp16, bf16)")


SLIDING_KEYS = ("sliding_window", "attention_chunk_size")
"""A config's keys for an attention that does not see the whole past (set, not null)."""


def onnxruntime_ops(config: dict) -> tuple[str, ...]:
    """The onnxruntime contrib ops ``--target onnxruntime`` writes for a checkpoint of
    ``config``: ``GroupQueryAttention`` only where the config (and its nested configs) says
    every layer attends causally to the whole past (no sliding window in use, no chunked
    attention); ``SkipSimplifiedLayerNormalization`` always."""
    return (*(() if _windowed(config) else ("GroupQueryAttention",)),
            "SkipSimplifiedLayerNormalization")


def _windowed(config: dict) -> bool:
    for said in [config, *(v for v in config.values() if isinstance(v, dict))]:
        window = said.get("use_sliding_window", True) is not False and any(
            said.get(key) is not None for key in SLIDING_KEYS)
        if window or any("sliding" in str(kind) or "chunk" in str(kind)
                         for kind in said.get("layer_types") or ()):
            return True
    return False
