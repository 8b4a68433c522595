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
    precision: str | None = None,
    block_size: int | None = None,
    symmetric: bool | None = None,
    progress: "Progress | None" = None,
    **onnx_options: Any,
) -> "ir.Model":
    """Export ``model`` with ``torch.export``, group it by ``rules`` and lower it to ONNX.

    ``model``: an ``nn.Module`` called with ``args`` / ``kwargs``, or the path of a Hugging
    Face checkpoint folder (``config.json`` and ``*.safetensors``): the model its config
    names, built by transformers with its weights mapped, called as ``cache`` says (``"kv"``,
    the default for causal LMs: decode-ready, the KV cache as inputs and outputs; ``"none"``:
    prefill only; see :mod:`rewrite.exporting.checkpoint`). ``trust_model`` lets a folder load
    code or pickled weights from itself.

    ``rules``: a :class:`RuleSet`, or what :func:`rewrite.load_rules` accepts (a path, a
    shipped name such as ``"gpt2"``); None: for a checkpoint the shipped rules of its
    ``model_type`` when there are any, else what ``rewrite suggest`` writes for the exported
    program (its text is sent to ``progress.note``). ``dynamic_shapes`` and ``strict`` go to
    ``torch.export.export``; ``onnx_options`` are the fields of
    :class:`~rewrite.backends.onnx.OnnxOptions` (``constants``, ``optimize``, ...).
    ``input_names`` / ``output_names`` rename the graph's first inputs / outputs, in order.
    With ``output``, the model is also written there (crash-safe; weights to ``OUTPUT.data``
    above ``external_data_threshold`` bytes, copied file to file from a file mapping such as
    ``from_pretrained``'s when provably equal). ``progress`` (a
    :class:`~rewrite.backends.onnx.Progress`, e.g. the CLI's ``Steps``) hears of each step.

    ``cache="static"`` with ``context`` (tokens): a fixed-size cache written in place at
    ``position_ids`` (for compilers that want fixed shapes); ``static`` (``{"batch": B,
    "seq": S}``) fixes those sizes too (see :mod:`rewrite.exporting.checkpoint.fixed_cache`).

    ``verify`` (a checkpoint written to ``output``): before it is published, onnxruntime runs
    the written model on a few tokens (a prefill and a decode step) and its outputs are
    compared with the eager model's; a mismatch raises :class:`VerificationError` and
    nothing is written.

    ``precision`` (a checkpoint): ``"fp32"``, ``"fp16"``, ``"bf16"`` build the model in that
    dtype (None: the checkpoint's); ``"int4"``: blockwise 4-bit weights (``block_size``,
    default 32; ``symmetric``, default True: int4, else uint4 with zero points) for every
    MatMul (the decoder layers' linears and the lm_head; embeddings stay float), one function
    per layer class kept (see :mod:`rewrite.exporting.precision`).

    Raises :class:`RuleError` for bad rules (before exporting), :class:`InputError` for an
    unusable folder, when ``torch.export`` fails (its error is the ``__cause__``) or
    ``output`` cannot be written, :class:`GroupingError` when a group cannot be outlined.
    """
    from rewrite.backends.onnx import SILENT, OnnxOptions

    folder = isinstance(model, (str, Path))
    options = OnnxOptions(**{"fold_weights": not folder, **onnx_options})
    report = progress or SILENT
    if folder:
        from rewrite.exporting.precision import Precision

        chosen = Precision.parse(precision, block_size, symmetric)
        if args or kwargs or dynamic_shapes is not None or input_names or output_names:
            raise InputError("a checkpoint folder is exported with its own inputs: args, "
                             "kwargs, dynamic_shapes and input/output names are not taken")
        from rewrite.exporting.checkpoint import export_checkpoint

        return export_checkpoint(model, rules=rules, cache=cache, output=output,
                                 trust_model=trust_model, progress=report, options=options,
                                 verify=verify, context=context, static=static,
                                 precision=chosen)
    if (cache is not None or trust_model or context is not None or static
            or precision is not None or block_size is not None or symmetric is not None):
        raise InputError("cache, context, static, trust_model and precision are options of a "
                         f"checkpoint folder, not of a {type(model).__name__}")
    return export_module(model, args, kwargs, rules=rules, dynamic_shapes=dynamic_shapes,
                         strict=strict, output=output, input_names=input_names,
                         output_names=output_names, progress=report, options=options)
