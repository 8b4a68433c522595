"""ONNX backend: groups become nested, deduplicated ONNX model-local functions.

``to_onnx(result)`` returns the ``onnx_ir.Model``; ``save_onnx(result, path)`` writes it
(atomically, with external data for large models). :mod:`pipeline` (:func:`lower`) runs the
stages, each a subpackage with a small public front and private modules:

1. ``lowering``: ONNX ops for the program, grouped with the same rules (strategies: per
   body, the flat program; the ``.onnx`` input is copied, not lowered);
2. ``outlining``: groups -> functions (members, boundaries, body keys, repeats, constants,
   recomputation, naming);
3. ``finishing``: optimize, merge scalar variants and equal functions, opsets.

Shared by two stages: ``_standins`` (calls left standing for the nodes they stand for, and
the plan the outliner follows), ``_opsets``. Around them: ``options`` (:class:`OnnxOptions`),
``progress`` (:class:`Progress`, how the backend reports; the CLI draws it), ``summary``
(the function tree as data), ``save`` (writing). Private APIs of torch, onnxscript and
onnx_ir: :mod:`rewrite._private`.

The pipeline imports torch.onnx and onnxscript; this package imports it on first use of
:func:`lower` / :class:`Lowered` (or ``to_onnx`` / ``save_onnx``), so that what only reads
ONNX models (``rewrite suggest`` on an ``.onnx`` file: ``outlining``) does not pay for them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.backends.onnx.distinct import Variant, Variants
from rewrite.backends.onnx.outlining import Keyer, canonical_order
from rewrite.backends.onnx.summary import call_sites, label, summarize

if TYPE_CHECKING:
    import onnx_ir as ir

    from rewrite.grouping import Grouped
    from rewrite.backends.onnx.pipeline import Lowered, Lowering, lower


def __getattr__(name: str) -> Any:
    """:func:`lower`, :class:`Lowered` (and its former name ``Lowering``), from
    :mod:`pipeline` on first use."""
    if name in ("lower", "Lowered", "Lowering"):
        value = getattr(importlib.import_module(f"{__name__}.pipeline"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_onnx(result: "Grouped", *, progress: Progress | None = None,
            **options: Any) -> "ir.Model":
    """An ``onnx_ir.Model`` whose groups are nested, deduplicated model-local functions.

    ``options`` are the fields of :class:`OnnxOptions` (``constants``, ``constant_limit``,
    ``optimize``); ``progress`` hears about the long steps (the CLI's
    :class:`rewrite.cli.steps.Steps` draws them on a console)."""
    from rewrite.backends.onnx.pipeline import lower
    from rewrite.files.mapped import verify

    lowering = lower(result, OnnxOptions(**options), progress or SILENT)
    verify(lowering.mapped)  # the .pt2 the weights are views of: intact
    return lowering.model


def save_onnx(result: "Grouped", output_path: str | Path, *, progress: Progress | None = None,
              **options: Any) -> Lowered:
    """Lower ``result`` and write it to ``output_path`` (never a partial file).

    Weights go to ``<output>.data`` when larger than ``external_data_threshold`` bytes (or
    to chunks of ``weights_chunk`` bytes), copied from a mapped input without passing
    through memory. ``progress`` hears about the steps, the warnings and what was written."""
    from rewrite.backends.onnx.pipeline import lower
    from rewrite.backends.onnx.save import write_model
    from rewrite.files.outputs import check_output_path

    given = [result.model] if isinstance(result.model, (str, Path)) else []
    output = check_output_path(output_path, given)
    opts = OnnxOptions(**options)
    report = progress or SILENT
    lowering = lower(result, opts, report)
    for warning in lowering.warnings:
        report.note(warning.render())
    with report.step(f"writing {output}"):
        data = write_model(lowering.model, output, threshold=opts.external_data_threshold,
                           chunk=opts.weights_chunk, progress=report, mapped=lowering.mapped)
    calls = lowering.outlined.calls
    text = f"{len(lowering.model.functions)} functions, {sum(calls.values())} call sites"
    if data:
        names = data[0].name if len(data) == 1 else f"{len(data)} files ({data[0].name}, ...)"
        text += f"; weights in {names}"
    report.note(text)
    return lowering


__all__ = ["Keyer", "Lowered", "Lowering", "OnnxOptions", "Progress", "Variant", "Variants",
           "call_sites", "canonical_order", "label", "lower", "save_onnx", "summarize",
           "to_onnx"]
