"""Lower an ExportedProgram with torch's own exporter (``torch.onnx.export(dynamo=True)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import torch
from attrs import frozen

from rewrite.errors import library_call
from rewrite.backends.onnx.lowering._torch_failure import torch_onnx_failure
from rewrite.errors import InputError

if TYPE_CHECKING:
    import onnx_ir as ir


@frozen
class Exported:
    """torch.onnx's flat model and the decomposed program it translated."""

    model: "ir.Model"
    program: torch.export.ExportedProgram
    """The program after ``run_decompositions``: ONNX node metadata names its nodes."""


def export_program(program: torch.export.ExportedProgram, *, optimize: bool = True,
                   custom_translation_table: Mapping | None = None) -> Exported:
    """``torch.onnx.export(program, dynamo=True, optimize=optimize)``; decomposes only once."""
    with library_call("torch.onnx", "converting the program", torch_onnx_failure):
        onnx_program = torch.onnx.export(
            program, dynamo=True, optimize=optimize, verbose=False, report=False,
            custom_translation_table=custom_translation_table,
        )
    decomposed = onnx_program.exported_program
    if decomposed is None:  # pragma: no cover - torch always records it
        raise InputError("torch.onnx.export did not record the program it translated")
    return Exported(onnx_program.model, decomposed)
