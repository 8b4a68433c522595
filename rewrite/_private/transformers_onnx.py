"""transformers' own ONNX translations of the ops its MoE layers call (a private table).

transformers 5 routes a mixture of experts through ``transformers::grouped_mm_fallback`` (or
``aten._grouped_mm``), which torch.onnx cannot translate; transformers' ONNX exporter carries
a translation for both (``exporters.exporter_onnx._ONNX_TRANSLATION_TABLE``, one ``MatMul``
per expert). Without that table (other transformers releases): ``{}``, and a program calling
those ops fails to lower with torch.onnx's error naming the op.

Importing that exporter costs ~0.2-0.4 s, and a translation table makes the lowering build
torchlib's registry again (~0.1 s): only a model with such layers asks for it
(:func:`has_experts`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

GROUPED_MM = ("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")
EXPERTS = "use_experts_implementation"
"""transformers' decorator of the experts classes whose forward dispatches to the grouped
matmuls: every modeling file calling them imports it (transformers 5)."""


def has_experts(model: "torch.nn.Module") -> bool:
    """Whether a module of ``model`` is defined where transformers' experts dispatch
    (:data:`EXPERTS`) is imported: the only models whose program may call the ops of
    :data:`GROUPED_MM`."""
    modules = {type(module).__module__ for module in model.modules()}
    return any(EXPERTS in vars(sys.modules[name]) for name in modules if name in sys.modules)


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
