"""A Hugging Face checkpoint folder in front of ``rewrite.export``: ``rewrite export DIR``.

The folder is checked (:mod:`folder`: config, weights, shards; code and pickles refused
unless trusted), its model built by transformers offline with the weights mapped
(:mod:`build`), called with its KV cache explicit (:mod:`cache`: the inputs, dynamic shapes
and I/O names; an encoder or encoder-decoder, prefill only: :mod:`encoders`; an
encoder-decoder decode-ready, two graphs over one data file: :mod:`seq2seq`), then
exported, grouped, lowered and written by the one pipeline of
:func:`rewrite.exporting.module.export_module`, with ``genai_config.json`` and the tokenizer
files beside it (:mod:`genai`: the folder onnxruntime-genai runs as is). Rules: the given
ones, else the shipped rules of the config's ``model_type``, else what ``rewrite suggest``
writes for the program.

Nothing of the process changes for it: no environment variable, no logger, no progress bar
(the CLI turns transformers' off for its own process). The model is built holding
:func:`rewrite._private.exclusive.exclusive` (transformers sets torch's default dtype and
replaces ``torch.nn.init``'s functions for the process while it builds one), and exported
with transformers' SDPA attention passing ``enable_gqa`` for this export only
(:func:`rewrite._private.transformers_attention.grouped_query_attention`).
"""

from __future__ import annotations

from functools import partial
from inspect import signature
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from attrs import evolve

from rewrite._private.exclusive import exclusive
from rewrite._private.transformers_attention import grouped_query_attention
from rewrite.exporting.checkpoint.build import is_causal_lm, load_model, model_class
from rewrite.exporting.checkpoint.cache import (
    CACHES,
    Call,
    LayerCache,
    cache_layout,
    calling,
    causal_lm_call,
)
from rewrite.exporting.checkpoint.checks import (
    causal_lm_check,
    encoder_check,
    fixed_cache_check,
    seq2seq_checks,
)
from rewrite.exporting.checkpoint.fixed_cache import (
    check_chunks,
    chunk_lengths,
    fixed_cache_call,
    fixed_cache_twin,
)
from rewrite.exporting.checkpoint.encoders import encoder_call, takes_text
from rewrite.exporting.checkpoint.seq2seq import (
    decoder_call,
    graphs,
    is_encoder_decoder,
    seq2seq_layout,
)
from rewrite.exporting.checkpoint.seq2seq import encoder_call as seq2seq_encoder_call
from rewrite.exporting.checkpoint.folder import Checkpoint, read_checkpoint
from rewrite.exporting.once import TRACES, repeated_layers, traced_once
from rewrite.exporting.checkpoint.genai import beside, plan
from rewrite.api import as_ruleset
from rewrite.compile import RuleSet, shipped_rules
from rewrite.errors import InputError, VerificationError, first_line
from rewrite.exporting.module import Variant, export_module
from rewrite.backends.onnx.shared_data import sibling_path
from rewrite.exporting.precision import Precision, checked, onnxruntime_ops, refuse_quantized
from rewrite.files.outputs import check_output_path

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx import OnnxOptions, Progress
    from rewrite.exporting.int4 import ShellExport
    from rewrite.exporting.twin import Twin
    from rewrite.exporting.verify import Check


def export_checkpoint(folder: str | Path, *, rules: RuleSet | str | Path | None,
                      cache: str | None, output: str | Path | None, trust_model: bool,
                      progress: "Progress", options: "OnnxOptions", verify: bool = True,
                      context: int | None = None, static: Mapping[str, Any] | None = None,
                      precision: Precision = Precision(None), trace: str = "layers"
                      ) -> "ir.Model":
    """``rewrite.export`` of a checkpoint folder (see :func:`rewrite.export`); ``verify``:
    the written model is run in onnxruntime and compared with eager before it is published
    (:mod:`rewrite.exporting.checkpoint.checks`); ``context`` and ``static``: the fixed
    cache of ``cache="static"`` (:mod:`rewrite.exporting.checkpoint.fixed_cache`);
    ``precision``: the dtype it is built in, or int4 weights
    (:mod:`rewrite.exporting.precision`); ``trace``: ``"layers"``, each distinct decoder
    layer traced once (:mod:`rewrite.exporting.once`), or ``"whole"``."""
    _check_cache_options(cache, context, static, trace)
    first, *more = _one_per_chunk(static or {}, output)
    checkpoint = read_checkpoint(folder, trust_model=trust_model)
    inputs = [checkpoint.path, *checkpoint.weights]
    for path in ([] if output is None else written(output, checkpoint.config, cache)):
        check_output_path(path, inputs)  # before transformers' import: a quick refusal
    refuse_quantized(checkpoint)
    options = _for_target(options, precision, checkpoint.config)
    cls = model_class(checkpoint)
    causal = _check_kind(checkpoint, cls, cache)
    pair = not causal and cache == "kv"  # an encoder-decoder's two graphs
    if pair and options.weights_chunk is not None:
        raise InputError("--weights-chunk: an encoder-decoder's two graphs share one data "
                         "file, which is not chunked")
    ruleset = _rules(checkpoint, rules, progress)
    verifying = verify and output is not None
    kind = cache or ("kv" if causal else "none")
    with progress.step(f"loading {checkpoint.path}"), exclusive():
        model = load_model(checkpoint, cls, precision.dtype())
        # on the weights as loaded: int4's shell reads no weight cheaply (zero pages)
        layout = cache_layout(model) if causal and kind in ("kv", "static") else None
        int4 = precision.start(model, progress.note, verifying)
    if pair:
        return _export_pair(model, checkpoint, ruleset, output, progress, options,
                            verifying, int4, trace == "layers")
    call, make = _call_and_check(model, causal, kind, layout, context, first, verifying)
    check = checked(int4, make)
    variants = [_variant(model, layout, context, one, Path(output), verifying, int4)
                for one in more if layout is not None and output is not None]
    if verify and output is not None and check is None:
        progress.note("not verified against eager: onnxruntime is fed from numpy, which "
                      "has no bfloat16")
    options = _with_moe_translations(options, model)
    genai = plan(checkpoint, model.config, call if causal else None, layout, kind)
    published = None if output is None else partial(beside, genai, Path(output))
    export = partial(export_module, model, call.args, None, rules=ruleset,
                     dynamic_shapes=call.dynamic_shapes, strict=False, output=output,
                     input_names=call.input_names, output_names=call.output_names,
                     progress=progress, options=options, inputs=inputs,
                     axis_names=call.axis_names, check=check, beside=published,
                     finish=None if int4 is None else int4.finish, variants=variants)
    twin = fixed_cache_twin(model, layout, context, first) if kind == "static" else None
    with calling(model, call), grouped_query_attention():
        exported = _traced(export, model, progress, trace == "layers", twin, _weighed(int4, check))
    if output is not None:
        progress.note(genai.note(Path(output)))
    return exported


def _weighed(int4: "ShellExport | None", check: Callable | None) -> bool:
    """Whether the layers traced once are checked before writing (two eager runs): not where
    the written model's check on the weights written stands for it (its failure: the model
    traced whole): an int4 export (its check has float32's tolerance on the same weights
    dequantized; 0.2 s of a 187M fp32 checkpoint's export) and int4's shell of placeholder
    weights (fp32 from another dtype), on which eager computes nothing to compare."""
    return check is None or int4 is None or not (int4.sources or int4.block is not None)


def _traced(export: Callable[..., "ir.Model"], model: "torch.nn.Module",
            progress: "Progress", layers: bool, twin: "Twin | None" = None,
            weighed: bool = True) -> "ir.Model":
    """``export(trace=...)``: each distinct layer traced once when ``layers``
    (:func:`traced_once`; checked at ``twin``'s sizes where it stands for the export's, or,
    not ``weighed`` (int4's shell, its weights placeholders), by the written model's check
    alone); a
    model so made that disagrees with eager when checked before
    publishing (nothing was written) is exported again with every layer traced, said in one
    line (the check runs the model's own code: what the per-layer check did not see)."""
    if not layers:
        return export()
    cut: list[bool] = []
    try:
        return export(trace=partial(traced_once, model, progress, used=cut, twin=twin,
                                    weighed=weighed))
    except VerificationError as e:
        if not cut:
            raise
        progress.note(f"torch.export traces every layer: the per-layer model disagreed with "
                      f"eager ({first_line(e)})")
    return export()


def written(output: str | Path, config: dict, cache: str | None) -> tuple[Path, ...]:
    """The models ``rewrite export`` writes for ``output``: ``output``, or for an
    encoder-decoder with ``--cache kv`` the two graphs in ``output``'s folder
    (:mod:`rewrite.exporting.checkpoint.seq2seq`)."""
    if cache == "kv" and is_encoder_decoder(config):
        return graphs(output)
    return (Path(output),)


def _export_pair(model: "torch.nn.Module", checkpoint: Checkpoint, ruleset: RuleSet | None,
                 output: str | Path | None, progress: "Progress", options: "OnnxOptions",
                 verify: bool, int4: "ShellExport | None", layers: bool) -> "ir.Model":
    """An encoder-decoder's encoder and decoder step, each exported, then written with one
    data file and the checkpoint's tokenizer files; returns the decoder's model. ``layers``:
    each part's layers traced once (:func:`_part_trace`)."""

    from rewrite.backends.onnx.save import write_models

    layout = seq2seq_layout(model)
    calls = (seq2seq_encoder_call(model), decoder_call(model, layout))
    checks = [checked(int4, partial(_nth_check, model, layout, n)) if verify else None
              for n in range(2)]
    options = _with_moe_translations(options, model)
    exported = []
    traces = [_part_trace(model, part, progress) if layers else None
              for part in ("get_encoder", "get_decoder")]
    for call, trace in zip(calls, traces):
        with calling(model, call), grouped_query_attention():
            exported.append(export_module(
                model, call.args, None, rules=ruleset, dynamic_shapes=call.dynamic_shapes,
                strict=False, output=None, input_names=call.input_names,
                output_names=call.output_names, progress=progress, options=options,
                axis_names=call.axis_names, finish=None if int4 is None else int4.finish,
                trace=trace))
    if output is not None:
        paths = graphs(output)
        genai = evolve(plan(checkpoint, model.config, None, None),
                       reason="written for decoder-only models; these are two graphs")
        data = write_models([(path, graph, check) for path, graph, check
                             in zip(paths, exported, checks)], progress=progress,
                            beside=beside(genai, paths[1], exported[1]))
        progress.note(f"{paths[0].name} and {paths[1].name}: their weights in one file, "
                      f"{data.name}; {genai.note(paths[1])}")
    return exported[1]


def _part_trace(model: "torch.nn.Module", getter: str, progress: "Progress"
                ) -> Callable | None:
    """The trace of the encoder's graph or the decoder step's (``getter``: ``get_encoder``
    or ``get_decoder``): each distinct layer of that part's one list of repeated layers once
    (:func:`traced_once`, checked as a module's: the program run eagerly against the model;
    a decoder layer's state is its self-attention's keys and values and its
    cross-attention's); None (every layer traced) for a model without that getter or such a
    list, and for the decoder on torch 2.9."""
    import torch

    if getter == "get_decoder" and torch.__version__ < (2, 10):
        return None  # its program then holds a torch.sym_sum, which torch 2.9's ONNX
        # translation lacks (whole, the decoder step's program holds none)
    part = getattr(model, getter)() if hasattr(model, getter) else None
    layers = repeated_layers(part) if part is not None else None
    if layers is None:
        return None
    return partial(traced_once, model, progress, kwargs={}, layers=layers)


def _rules(checkpoint: Checkpoint, rules: RuleSet | str | Path | None, progress: "Progress"
           ) -> RuleSet | None:
    """The given rules, else the shipped rules of the checkpoint's ``model_type`` (said), else
    None (suggested for the program)."""
    shipped = default_rules(checkpoint) if rules is None else None
    chosen = rules if rules is not None else shipped
    if shipped is not None:
        progress.note(f"rules: {shipped.name}, shipped for model_type "
                      f"{checkpoint.model_type!r}")
    return as_ruleset(chosen) if chosen is not None else None


def _for_target(options: "OnnxOptions", precision: Precision, config: dict) -> "OnnxOptions":
    """``options`` with the onnxruntime contrib ops ``--target onnxruntime`` writes for a
    checkpoint of ``config`` (:func:`~rewrite.exporting.precision.onnxruntime_ops`)."""
    if precision.target != "onnxruntime":
        return options
    return evolve(options, onnxruntime_ops=onnxruntime_ops(config))


def _check_cache_options(cache: str | None, context: int | None,
                         static: Mapping[str, Any] | None, trace: str = "layers") -> None:
    """:class:`InputError` for cache options that do not go together, or an unknown
    ``trace``."""
    if trace not in TRACES:
        raise InputError(f"trace={trace!r}: expected one of {', '.join(TRACES)}")
    if cache is not None and cache not in CACHES:
        raise InputError(f"cache={cache!r}: expected one of {', '.join(CACHES)}")
    if cache == "static" and (context is None or context < 1):
        raise InputError("--cache static needs --context C, the cache's length in tokens")
    if context is not None and cache != "static":
        raise InputError("--context sets the length of a fixed cache: it goes with "
                         "--cache static")
    if static and cache != "static":
        raise InputError("--static fixes every shape of a fixed cache: it goes with "
                         "--cache static")
    unknown = set(static or {}) - {"batch", "seq"}
    if unknown:
        raise InputError(f"--static takes batch=B and seq=S, not {', '.join(sorted(unknown))}")
    check_chunks(static or {}, context)


def _one_per_chunk(static: Mapping[str, Any], output: str | Path | None
                   ) -> list[dict[str, Any]]:
    """``static`` once per chunk length it asks (one ``seq`` each), or as it is."""
    seqs = chunk_lengths(static)
    if len(seqs) > 1 and output is None:
        raise InputError("several seq= sizes write one model each beside the output: give "
                         "an output")
    return [{**static, "seq": seq} for seq in seqs] or [dict(static)]


def _nth_check(model: "torch.nn.Module", layout: tuple, n: int) -> "Check | None":
    """An encoder-decoder's check of its encoder (0) or decoder (1)."""
    return seq2seq_checks(model, layout)[n]


def _variant(model: "torch.nn.Module", layout: tuple[LayerCache, ...], context: int | None,
             static: dict[str, int], output: Path, verify: bool, int4: "ShellExport | None"
             ) -> Variant:
    """The model of one more chunk length, beside ``output`` (:func:`sibling_path`)."""
    assert context is not None
    call = fixed_cache_call(model, layout, context, static)
    check = checked(int4, partial(fixed_cache_check, model, layout, context, static)) \
        if verify else None
    return Variant(call.args, sibling_path(output, static["seq"]), check)


def _call_and_check(model: "torch.nn.Module", causal: bool, cache: str,
                    layout: "tuple[LayerCache, ...] | None", context: int | None,
                    static: dict[str, Any], verify: bool
                    ) -> tuple[Call, "Callable[[], Check | None] | None"]:
    """How ``model`` is called while exporting and how to compute what the written model
    must reproduce (None: not checked); ``layout``: the model's own cache layout
    (:func:`cache_layout`; None: no cache)."""
    if not causal:
        call = encoder_call(model)
        return call, partial(encoder_check, model, call) if verify else None
    if cache == "static":
        assert layout is not None
        call = fixed_cache_call(model, layout, context, static)
        return (call, partial(fixed_cache_check, model, layout, context, static)
                if verify else None)
    return (causal_lm_call(model, layout),
            partial(causal_lm_check, model, layout) if verify else None)


def _check_kind(checkpoint: Checkpoint, cls: type, cache: str | None) -> bool:
    """Whether ``cls`` is a causal LM (else an encoder or an encoder-decoder: prefill only,
    or with ``--cache kv`` an encoder-decoder's two graphs); InputError for a model without
    text input, or a cache asked of a model that cannot have it."""
    if is_causal_lm(cls):
        return True
    pair = cache == "kv" and is_encoder_decoder(checkpoint.config)
    if pair and (takes_text(cls) or "input_features" in signature(cls.forward).parameters):
        return False
    if not takes_text(cls):
        raise InputError(f"{checkpoint.path}: {cls.__name__} does not take input_ids; "
                         "rewrite export takes text models (causal LMs, encoders, "
                         "encoder-decoders) and, with --cache kv, encoder-decoders over "
                         "input_features (Whisper)")
    if cache in ("kv", "static"):
        raise InputError(f"{checkpoint.path}: {cls.__name__} is not a causal language "
                         f"model: --cache {cache} needs one (use --cache none)")
    return False


def _with_moe_translations(options: "OnnxOptions", model: "torch.nn.Module"
                           ) -> "OnnxOptions":
    """``options`` with transformers' translations of its MoE ops (the caller's win) where
    ``model`` has such layers; else ``options`` (transformers' exporter not imported)."""

    from rewrite._private.transformers_onnx import has_experts, moe_translations

    if not has_experts(model):
        return options
    table = {**moe_translations(), **(options.custom_translation_table or {})}
    return evolve(options, custom_translation_table=table or None)


def default_rules(checkpoint: Checkpoint) -> Path | None:
    """The shipped rules of the checkpoint's ``model_type``, or None (then suggested)."""
    return shipped_rules(checkpoint.model_type) if checkpoint.model_type else None


__all__ = ["CACHES", "Call", "Checkpoint", "default_rules", "export_checkpoint",
           "read_checkpoint", "written"]
