"""Lower an ExportedProgram with torch's own exporter (``torch.onnx.export(dynamo=True)``)."""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING

import torch
from attrs import frozen

from rewrite.errors import InputError

if TYPE_CHECKING:
    import onnx_ir as ir


@frozen
class Exported:
    """torch.onnx's flat model and the decomposed program it translated."""

    model: "ir.Model"
    program: torch.export.ExportedProgram
    """The program after ``run_decompositions``: ONNX node metadata names its nodes."""


@contextlib.contextmanager
def _quiet_exporter():
    """Mute the exporter's log chatter (torchvision notices, failed folding attempts)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_reason(e: BaseException) -> str:
    """One line saying why torch failed: the exception summary of torch.onnx's long report
    (after its generic first line), else the first line; without terminal colour codes."""
    text = _ANSI.sub("", str(e)).strip()
    if not text:
        return type(e).__name__
    first = text.splitlines()[0]
    if "## Exception summary" in text:
        summary = [t.strip() for t in text.split("## Exception summary", 1)[1].splitlines()
                   if t.strip()]
        if summary:
            return f"{first.split('. ')[0]}: {summary[0]}"
    return first


def export_program(program: torch.export.ExportedProgram, *, optimize: bool = True) -> Exported:
    """``torch.onnx.export(program, dynamo=True, optimize=optimize)``; decomposes only once."""
    try:
        with _quiet_exporter():
            onnx_program = torch.onnx.export(
                program, dynamo=True, optimize=optimize, verbose=False, report=False
            )
    except Exception as e:  # the exporter raises its own error types; all mean "cannot lower"
        raise InputError(f"torch.onnx.export cannot convert this program: {failure_reason(e)}") from None
    decomposed = onnx_program.exported_program
    if decomposed is None:  # pragma: no cover - torch always records it
        raise InputError("torch.onnx.export did not record the program it translated")
    return Exported(onnx_program.model, decomposed)
