"""``rewrite.export``: the one entry point for an ``nn.Module`` or a checkpoint folder.

A module goes to :func:`rewrite.exporting.module.export_module`; a folder to
:func:`rewrite.exporting.checkpoint.export_checkpoint`, which builds the model and hands it
to the same function.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rewrite.compile import RuleSet
from rewrite.errors import InputError
from rewrite.exporting.module import export_module

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx import Progress


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
    static: Mapping[str, int] | None = None,
    trust_model: bool = False,
    verify: bool = True,
    progress: "Progress | None" = None,
    **onnx_options: Any,
) -> "ir.Model":
    """Export ``model`` with ``torch.export``, group it by ``rules`` and lower it to ONNX.

    ``model``: an ``nn.Module`` called with ``args`` / ``kwargs`` (``dynamic_shapes`` and
    ``strict`` go to ``torch.export.export``; ``input_names`` / ``output_names`` rename the
    graph's first inputs / outputs), or a Hugging Face checkpoint folder built by
    transformers with its weights mapped and called as ``cache`` says: ``"kv"`` (causal LMs'
    default: the KV cache as inputs and outputs), ``"none"`` (prefill), ``"static"`` (a
    cache of ``context`` tokens written in place; ``static={"batch": B, "seq": S}`` fixes
    those too); ``trust_model`` lets a folder run its own code; ``verify``: the written
    model is compared with eager in onnxruntime before it is published
    (:class:`VerificationError` on a mismatch, nothing written).
    ``rules``: a :class:`RuleSet` or what :func:`rewrite.load_rules` takes; None: a
    checkpoint's shipped rules, else what ``rewrite suggest`` writes (sent to
    ``progress.note``). ``onnx_options``: :class:`~rewrite.backends.onnx.OnnxOptions`'s
    fields. With ``output`` the model is also written (crash-safe, weights copied file to
    file where they lie in a file). ``progress`` hears of each step.

    Raises :class:`RuleError` (bad rules), :class:`InputError` (an unusable folder, what
    ``torch.export`` rejects, an unwritable ``output``), :class:`GroupingError` (a group
    that cannot be outlined)."""
    from rewrite.backends.onnx import SILENT, OnnxOptions

    folder = isinstance(model, (str, Path))
    options = OnnxOptions(**{"fold_weights": not folder, **onnx_options})
    report = progress or SILENT
    if folder:
        if args or kwargs or dynamic_shapes is not None or input_names or output_names:
            raise InputError("a checkpoint folder is exported with its own inputs: args, "
                             "kwargs, dynamic_shapes and input/output names are not taken")
        from rewrite.exporting.checkpoint import export_checkpoint

        return export_checkpoint(model, rules=rules, cache=cache, output=output,
                                 trust_model=trust_model, progress=report, options=options,
                                 verify=verify, context=context, static=static)
    if cache is not None or trust_model or context is not None or static:
        raise InputError("cache, context, static and trust_model are options of a "
                         f"checkpoint folder, not of a {type(model).__name__}")
    return export_module(model, args, kwargs, rules=rules, dynamic_shapes=dynamic_shapes,
                         strict=strict, output=output, input_names=input_names,
                         output_names=output_names, progress=report, options=options)
