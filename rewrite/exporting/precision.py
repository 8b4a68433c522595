"""``rewrite export --precision fp32|fp16|bf16|int4 [--block-size B] [--asymmetric]``.

``fp32``, ``fp16``, ``bf16``: the model is built by transformers in that dtype (weights and
compute; a dtype other than the checkpoint's is a converted copy in memory, not a mapping),
then exported as it is. ``int4``: the model is built in float32 (what the builder's ``-p
int4 -e cpu`` computes in), exported, and before it is written the weights of every
``MatMul`` (every linear of the decoder layers, and the lm_head, as onnxruntime-genai's
builder does by default; the embeddings stay in float, as there) become blockwise 4-bit
(:mod:`rewrite.backends.onnx.quantize`), each computed as it is written.

The model written is checked against eager PyTorch in float32 (:mod:`rewrite.exporting.verify`)
with the bound of a quantized model: ``|int4 - fp32| <= INT4_RTOL * max|fp32|`` per output,
a bound that catches a wrong layout or a lost weight (errors of the size of the values), not
the quantization error itself, which the note reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from attrs import evolve, frozen

from rewrite.errors import InputError

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.exporting.checkpoint.folder import Checkpoint
    from rewrite.exporting.verify import Check

PRECISIONS = ("fp32", "fp16", "bf16", "int4")
BLOCK_SIZES = (16, 32, 64, 128, 256)
"""onnxruntime's ``MatMulNBits`` block sizes (powers of two from 16)."""
INT4_ATOL = 1e-3
INT4_RTOL = 0.6
"""The int4 check's bound (see the module docstring): measured on small random Llama,
Phi-3 and GPT-2 checkpoints the largest logit difference is 0.12 to 0.26 of the largest
logit; on a random 58M-parameter Llama (8 layers) a layer's cache differs by 0.36 of its
largest value: loose, it catches errors of the size of the values (a wrong layout)."""


@frozen
class Precision:
    """What ``--precision`` asks for."""

    name: str | None
    """One of :data:`PRECISIONS`; None: the checkpoint's dtype."""
    block: int = 32
    symmetric: bool = True

    @classmethod
    def parse(cls, name: str | None, block: int | None, symmetric: bool | None
              ) -> "Precision":
        """Checked options (InputError: one line)."""
        if name is not None and name not in PRECISIONS:
            raise InputError(f"precision={name!r}: expected one of {', '.join(PRECISIONS)}")
        if name != "int4" and (block is not None or symmetric is not None):
            raise InputError("--block-size and --asymmetric set the int4 quantization: they "
                             "go with --precision int4")
        block = 32 if block is None else block
        if block not in BLOCK_SIZES:
            raise InputError(f"--block-size {block}: expected one of "
                             f"{', '.join(map(str, BLOCK_SIZES))} (onnxruntime's MatMulNBits)")
        return cls(name, block, True if symmetric is None else symmetric)

    @property
    def quantized(self) -> bool:
        return self.name == "int4"

    def dtype(self) -> "torch.dtype | str":
        """The dtype transformers builds the model in (``"auto"``: the checkpoint's)."""
        import torch

        return {None: "auto", "fp32": torch.float32, "int4": torch.float32,
                "fp16": torch.float16, "bf16": torch.bfloat16}[self.name]

    def check(self, check: "Check | None") -> "Check | None":
        """The check of the written model: a quantized one's bound (module docstring)."""
        if check is None or not self.quantized:
            return check
        return evolve(check, atol=INT4_ATOL, rtol=INT4_RTOL,
                      what=f"{check.what}, int4 against eager float32, allowed "
                           f"{INT4_RTOL:g} of the largest value")

    def finish(self, report: Callable[[str], None]) -> "Callable[[ir.Model], None] | None":
        """What is done to the lowered model before it is written (None: nothing)."""
        if not self.quantized:
            return None

        def quantize(model: "ir.Model") -> None:
            from rewrite.backends.onnx.quantize import quantize_int4

            report(quantize_int4(model, block=self.block, symmetric=self.symmetric).note())
        return quantize


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
