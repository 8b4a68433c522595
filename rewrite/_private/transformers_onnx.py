"""transformers' own ONNX translations of the ops its MoE layers call (a private table).

transformers 5 routes a mixture of experts through ``transformers::grouped_mm_fallback`` (or
``aten._grouped_mm``), which torch.onnx cannot translate; transformers' ONNX exporter carries
a translation for both (``exporters.exporter_onnx._ONNX_TRANSLATION_TABLE``, one ``MatMul``
per expert). Without that table (other transformers releases): ``{}``, and a program calling
those ops fails to lower with torch.onnx's error naming the op.
"""

from __future__ import annotations

from typing import Callable

GROUPED_MM = ("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")


def moe_translations() -> dict[Callable, Callable]:
    """The op -> translation entries of transformers' table for grouped matmuls."""
    try:
        from transformers.exporters.exporter_onnx import _ONNX_TRANSLATION_TABLE as table
    except (ImportError, AttributeError):
        return {}
    return {op: fn for op, fn in table.items() if _name(op) in GROUPED_MM}


def _name(op: object) -> str:
    namespace = getattr(op, "namespace", "")
    return f"{namespace}.{getattr(op, '_opname', '')}.{getattr(op, '_overloadname', '')}"
