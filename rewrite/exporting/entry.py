"""``rewrite.export``: the one entry point for an ``nn.Module`` or a checkpoint folder.

A module goes to :func:`rewrite.exporting.module.export_module`; a folder to
:func:`rewrite.exporting.checkpoint.export_checkpoint`, which builds the model and hands it
to the same function.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rewrite.compile import RuleSet
from rewrite.errors import InputError
from rewrite.exporting.module import export_module

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx import OnnxOptions, Progress
    from rewrite.exporting.module import Tracing


def export(
    model: "torch.nn.Module | str | Path",
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    rules: RuleSet | str | Path | None = None,
    dynamic_shapes: Any = None,
    strict: bool = False,
    output: str | Path | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    cache: str | None = None,
    context: int | None = None,
    static: Mapping[str, int | Sequence[int]] | None = None,
    trust_model: bool = False,
    verify: bool = True,
    trace: str = "layers",
    precision: str | None = None,
    block_size: int | None = None,
    symmetric: bool | None = None,
    target: str | None = None,
    progress: "Progress | None" = None,
    **onnx_options: Any,
) -> "ir.Model":
    """Export ``model`` with ``torch.export``, group it by ``rules`` and lower it to ONNX.

    ``model``: an ``nn.Module`` called with ``args`` / ``kwargs`` (``dynamic_shapes``,
    ``strict``: ``torch.export.export``'s; ``input_names`` / ``output_names`` rename the
    graph's first inputs / outputs), or a Hugging Face checkpoint folder, built by
    transformers with its weights mapped and called as ``cache`` says: ``"kv"`` (causal LMs'
    default; an encoder-decoder's two graphs in ``output``'s folder, the decoder's model
    returned), ``"none"`` (prefill), ``"static"`` (a cache of ``context`` tokens written in
    place; ``static={"batch": B, "seq": S}`` fixes those too; ``"seq": [128, 1]``: also
    ``OUT_seq1.onnx`` beside, one data file); ``trust_model`` lets it run its own code;
    ``verify`` compares the written model with eager in onnxruntime before publishing;
    ``trace``: ``"layers"`` (each distinct decoder layer, or a module's repeated layer,
    traced once where it can be) or ``"whole"``; ``precision``: ``fp32``, ``fp16``, ``bf16``
    or ``int4`` (``block_size``, ``symmetric``, ``target``: :mod:`.precision`); ``rules``: a
    :class:`RuleSet` or what :func:`rewrite.load_rules` takes (None: shipped, else suggested);
    ``onnx_options``: ``OnnxOptions``' fields; ``output``: crash-safe; ``progress``: the steps.

    Raises :class:`RuleError`, :class:`InputError` (an unusable folder, what torch.export
    rejects, an unwritable output), :class:`VerificationError`, :class:`GroupingError`."""
    from rewrite.backends.onnx import SILENT, OnnxOptions

    folder, report = isinstance(model, (str, Path)), progress or SILENT
    options = _options(OnnxOptions, folder, onnx_options)
    for_folders = dict(cache=cache, context=context, static=static, trust_model=trust_model,
                       verify=verify, trace=trace, precision=precision, block_size=block_size,
                       symmetric=symmetric, target=target)
    if folder:
        if args or kwargs or dynamic_shapes is not None or input_names or output_names:
            raise InputError("a checkpoint folder is exported with its own inputs: args, "
                             "kwargs, dynamic_shapes and input/output names are not taken")
        return _checkpoint(model, rules, output, report, options, **for_folders)
    _refuse_folder_options(for_folders, model)
    return export_module(model, args, kwargs, rules=rules, dynamic_shapes=dynamic_shapes,
                         strict=strict, output=output, input_names=input_names,
                         output_names=output_names, progress=report, options=options,
                         trace=_module_trace(model, trace, kwargs, strict, report))


def _module_trace(model: "torch.nn.Module", trace: str, kwargs: Mapping[str, Any] | None,
                  strict: bool, progress: "Progress") -> "Tracing | None":
    """How a module is traced: ``"layers"``, each distinct layer of its one list of repeated
    layers once (:func:`~rewrite.exporting.once.traced_once`: where it has such a
    list and its layers can be cut, the whole module otherwise, said in a note); ``"whole"``,
    or a strict export (torch.export's own Python tracer would trace the cut): None."""
    from rewrite.exporting.once import TRACES, traced_once

    if trace not in TRACES:
        raise InputError(f"trace={trace!r}: expected one of {', '.join(TRACES)}")
    if trace == "whole" or strict:
        return None
    return partial(traced_once, model, progress, kwargs=dict(kwargs or {}))


def _refuse_folder_options(for_folders: dict, model: Any) -> None:
    """:class:`InputError` naming the options of a checkpoint folder given for a module."""
    given = [k for k, v in for_folders.items()
             if v not in (None, False) and k not in ("verify", "trace")]
    if given:
        raise InputError(f"{', '.join(given)}: options of a checkpoint folder, not of a "
                         f"{type(model).__name__}")


def _options(kind: type, folder: bool, given: Mapping[str, Any]) -> Any:
    """``kind`` (``OnnxOptions``) of ``given``; a checkpoint folder's defaults: the weights
    kept the checkpoint's bytes, the attention fused, the projections packed, and written to
    the data file whatever their size (the deployment's layout, as onnxruntime-genai's
    builder writes it: onnxruntime maps that file where it would copy embedded weights into
    its heap)."""
    deployment = {"external_data_threshold": 0} if folder else {}
    return kind(**{"fold_weights": not folder, "fuse_attention": folder,
                   "pack_projections": folder, **deployment, **given})


def _checkpoint(folder: str | Path, rules: RuleSet | str | Path | None,
                output: str | Path | None, progress: "Progress", options: "OnnxOptions",
                *, precision: str | None, block_size: int | None, symmetric: bool | None,
                target: str | None, **choices: Any) -> "ir.Model":
    """:func:`export` of a checkpoint folder (``choices``: cache, context, static,
    trust_model, verify, trace)."""
    from rewrite.exporting.checkpoint import export_checkpoint
    from rewrite.exporting.precision import Precision

    return export_checkpoint(folder, rules=rules, output=output, progress=progress,
                             options=options, precision=Precision.parse(
                                 precision, block_size, symmetric, target), **choices)
