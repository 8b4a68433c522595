"""ONNX backend: groups become nested, deduplicated ONNX model-local functions.

``to_onnx(result)`` returns the ``onnx_ir.Model``; ``save_onnx(result, path)`` writes it
(atomically, with external data for large models). Modules, one concern each:

* ``export``: torch.onnx.export of the program (ops are lowered by torch, never here);
* ``remap``: group torch.onnx's nodes with the same rules (exact module calls from the FX
  program the exporter translated);
* ``outline``: groups -> functions (``boundary``: a group's inputs/outputs; ``structure``:
  body keys for dedup; ``repeats``: repeated blocks matched node by node; ``constants``: the
  constant policy; ``remat``: shared cheap nodes recomputed; ``naming``; ``opsets``);
* ``pipeline``: the pipeline, :func:`lower` (``clone``: the copy a given model is outlined
  in); ``save``: writing; ``summary``: the function tree as data; ``progress``: how it
  reports (rendered by the caller: the CLI draws it on the console).

The pipeline imports torch.onnx and onnxscript; this package imports it on first use of
:func:`lower` / :class:`Lowering` (or ``to_onnx`` / ``save_onnx``), so that what only reads
ONNX models (``rewrite suggest`` on an ``.onnx`` file: ``structure``, ``boundary``) does not
pay for them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.backends.onnx.summary import summarize

if TYPE_CHECKING:
    import onnx_ir as ir

    from rewrite.api import Result
    from rewrite.backends.onnx.pipeline import Lowering, lower


def __getattr__(name: str) -> Any:
    """:func:`lower` and :class:`Lowering`, from :mod:`pipeline` on first use."""
    if name in ("lower", "Lowering"):
        value = getattr(importlib.import_module(f"{__name__}.pipeline"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_onnx(result: "Result", *, progress: Progress | None = None,
            **options: Any) -> "ir.Model":
    """An ``onnx_ir.Model`` whose groups are nested, deduplicated model-local functions.

    ``options`` are the fields of :class:`OnnxOptions` (``constants``, ``constant_limit``,
    ``optimize``); ``progress`` hears about the long steps (the CLI's
    :class:`rewrite.cli.steps.Steps` draws them on a console)."""
    from rewrite.backends.onnx.pipeline import lower
    from rewrite.backends.onnx.save import verify_weights

    model = lower(result, OnnxOptions(**options), progress or SILENT).model
    verify_weights(model)
    return model


def save_onnx(result: "Result", output_path: str | Path, *, progress: Progress | None = None,
              **options: Any) -> Lowering:
    """Lower ``result`` and write it to ``output_path`` (never a partial file).

    Weights go to ``<output>.data`` when larger than ``external_data_threshold`` bytes (or
    to chunks of ``weights_chunk`` bytes), copied from a mapped input without passing
    through memory. ``progress`` hears about the steps, the warnings and what was written."""
    from rewrite.backends.onnx.pipeline import lower
    from rewrite.backends.onnx.save import write_model
    from rewrite.outputs import check_output_path

    given = [result.model] if isinstance(result.model, (str, Path)) else []
    output = check_output_path(output_path, given)
    opts = OnnxOptions(**options)
    report = progress or SILENT
    lowering = lower(result, opts, report)
    for warning in lowering.warnings:
        report.note(warning.render())
    with report.step(f"writing {output}"):
        data = write_model(lowering.model, output, threshold=opts.external_data_threshold,
                           chunk=opts.weights_chunk, progress=report)
    calls = lowering.outlined.calls
    text = f"{len(lowering.model.functions)} functions, {sum(calls.values())} call sites"
    if data:
        names = data[0].name if len(data) == 1 else f"{len(data)} files ({data[0].name}, ...)"
        text += f"; weights in {names}"
    report.note(text)
    return lowering


__all__ = ["Lowering", "OnnxOptions", "Progress", "lower", "save_onnx", "summarize", "to_onnx"]
