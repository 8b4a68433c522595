"""What ``torch.export`` is given for a causal LM: the call, example inputs, dynamic shapes
and the ONNX input/output names.

``kv`` (decode-ready): the model is called with its KV cache explicit, the names optimum and
onnxruntime-genai use::

    inputs   input_ids [batch_size, sequence_length],
             attention_mask [batch_size, total_sequence_length],
             position_ids [batch_size, sequence_length],
             past_key_values.N.key / .value
                 [batch_size, kv_heads, past_sequence_length, head_dim]   (N = 0, 1, ...)
    outputs  logits [batch_size, sequence_length, vocab],
             present.N.key / .value
                 [batch_size, kv_heads, past_sequence_length + sequence_length, head_dim]

(the ONNX model's dimension names; ``total_sequence_length`` is the past and the new tokens).
A hybrid's short-convolution layer (LFM2) keeps no keys and values but its convolution's last
inputs: ``past.N.conv`` / ``present.N.conv [batch_size, channels, kernel width]`` (zeros
before the first token), the names onnxruntime-genai uses; a state-space or gated delta
layer (Mamba-2: Bamba, GraniteMoE-Hybrid...; Mamba, Jamba; Qwen3-Next, Qwen3.5...) its
recurrent state beside it, ``past.N.recurrent`` / ``present.N.recurrent`` (Mamba-2's
``[batch_size, heads, head_dim, state]``, Mamba's ``[batch_size, channels, state]``, a gated
delta net's ``[batch_size, value heads, key_dim, value_dim]``, RecurrentGemma's
``[batch_size, lru_width]``; zeros before the first token); MiniMax's lightning attention
its recurrent state alone (``[batch_size, heads, head_dim, head_dim]``; states transformers
keeps outside its cache layers: :mod:`~rewrite.exporting.checkpoint.module_states`). A layer
with several convolution states numbers them, ``past.N.conv.K`` (Inkling's four, beside its
keys and values; RWKV's two token shifts beside its recurrent state, ``past.N.conv.0`` /
``.1`` and ``past.N.recurrent [batch_size, 3, width]``, from the state list its forward takes
instead of a cache). DeepSeek-V4's compressing layers keep their compressors' states after
their keys and values, named ``past.N.compressor.kv`` / ``.gate`` / ``.compressed`` (and
``past.N.indexer.*``: :mod:`~rewrite.exporting.checkpoint.compressed`).

``position_ids`` count from 0 in every model, as onnxruntime-genai feeds them (from the
attention mask). A family that numbers its positions from elsewhere has the offset added
inside the graph (:func:`position_offset`: RoBERTa's family starts after its padding index),
so the documented inputs give the model's own logits.

The past is a transformers ``DynamicCache`` made of the given tensors (one full layer each):
each attention appends its new keys and values inside its own module, so a decoder layer's
function takes its layer's cache and returns the updated one, and one function still serves
every layer of a class. The past length may be 0 (the first step). ``none`` (prefill only):
``input_ids``, ``attention_mask``, ``position_ids`` in, ``logits`` out.

The call is the model's own: its ``forward`` is replaced on the instance while exporting
(:func:`decode_forward`), so module paths and weight names stay those of the checkpoint.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from attrs import frozen

from rewrite.errors import InputError, first_line, library_call
from rewrite.exporting.checkpoint.compressed import eager_states, grows, state_names
from rewrite.exporting.checkpoint.module_states import (
    keep_listed_state,
    listed_state,
    own_cache,
    rwkv_cache,
    states_in_cache,
)
from rewrite.exporting.checkpoint.scans import scan_modules, traced_scans

if TYPE_CHECKING:
    import torch

CACHES = ("kv", "none", "static")
EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST = 2, 3, 4


@frozen(eq=False)
class Call:
    """What ``rewrite.export`` needs to export a model in one calling convention."""

    args: tuple
    dynamic_shapes: tuple
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    axis_names: tuple
    """``dynamic_shapes`` with the ONNX names of the dimensions (``batch_size``, ...)."""
    forward: Callable[..., tuple]
    """The forward the model is exported with (:func:`calling`): :func:`decode_forward` for
    a causal LM."""
    position_offset: int = 0
    """What the graph adds to ``position_ids`` (:func:`position_offset`)."""


@frozen
class NamedState:
    """A state a layer keeps beside its keys and values under a name of its own
    (DeepSeek-V4's compressor states: :mod:`~rewrite.exporting.checkpoint.compressed`)."""

    name: str
    shape: tuple[int, ...]
    """Its shape without the batch (with the example's length where it :attr:`grows`)."""
    dtype: Any
    grows: bool
    """Whether its axis 1 has a row per token of the past (else its shape is fixed)."""


@frozen
class LayerCache:
    """The shapes of one layer's cache, read from the model itself (:func:`cache_layout`):
    keys ``[batch, key_heads, length, key_dim]``, values ``[batch, value_heads, length,
    value_dim]`` (multi-head latent attention has keys wider than values)."""

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv: tuple[int, int] | None = None
    """A short convolution's state, ``[batch, channels, width]``: (channels, width), kept
    instead of keys and values by a hybrid's convolution layer (LFM2), or beside them
    (Inkling)."""
    more_convs: tuple[tuple[int, int], ...] = ()
    """The layer's further convolution states, as :attr:`conv` (Inkling's layers keep four:
    its keys', values', attention output's and MLP output's)."""
    recurrent: tuple[int, ...] | None = None
    """A recurrent state's shape without its batch, kept beside the convolution state by a
    state-space or gated delta layer (Mamba-2's ``[batch, heads, head_dim, state]``), or
    None."""
    kv: bool = True
    """Whether the layer keeps keys and values (a hybrid's convolution layer does not)."""
    recurrent_dtype: Any = None
    """The recurrent state's dtype as the model keeps it (float32 in a bfloat16 model:
    RWKV's, RecurrentGemma's), or None: the model's."""
    indexer: int | None = None
    """The width of the indexer keys kept beside the keys and values, ``[batch, length,
    width]``, by a sparse-attention layer (DeepSeek-V3.2's, GLM-MoE-DSA's), or None."""
    named: tuple[NamedState, ...] = ()
    """The states kept after the keys and values under names of their own (DeepSeek-V4's
    compressors')."""

    def empty(self, batch: int, length: int, dtype: "torch.dtype | None" = None
              ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Zero keys and values of ``length`` positions."""
        import torch

        keys, values = self.shapes(batch, length)
        return torch.zeros(keys, dtype=dtype), torch.zeros(values, dtype=dtype)

    def unwritten(self, batch: int, length: int, dtype: "torch.dtype | None" = None
                  ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Keys and values of ``length`` positions whose memory is never written: an example
        of which only the shapes are read (torch.export's), no page of it resident (64 MB
        of zeros otherwise: a 1.24B Llama's buffers of 2048 positions)."""
        import torch

        keys, values = self.shapes(batch, length)
        return torch.empty(keys, dtype=dtype), torch.empty(values, dtype=dtype)

    def shapes(self, batch: int, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of keys and values of ``length`` positions."""
        return ((batch, self.key_heads, length, self.key_dim),
                (batch, self.value_heads, length, self.value_dim))

    def past(self, batch: int, length: int, dtype: "torch.dtype | None" = None
             ) -> tuple["torch.Tensor", ...]:
        """The layer's state as the graph takes it (:meth:`names`): keys and values of
        ``length`` positions if it keeps them, indexer keys of as many, or a convolution state
        and maybe a recurrent state (zeros: no token before)."""
        import torch

        conv = tuple(torch.zeros(batch, *shape, dtype=dtype) for shape in self.convs())
        recurrent = (torch.zeros(batch, *self.recurrent, dtype=self.recurrent_dtype or dtype),) \
            if self.recurrent else ()
        indexer = (torch.zeros(batch, length, self.indexer, dtype=dtype),) \
            if self.indexer else ()
        named = tuple(torch.zeros(batch, *((length, *s.shape[1:]) if s.grows else s.shape),
                                  dtype=s.dtype) for s in self.named)
        return (*(self.empty(batch, length, dtype) if self.kv else ()), *indexer, *conv,
                *recurrent, *named)

    def names(self, n: int, present: bool = False) -> tuple[str, ...]:
        """The I/O names of layer ``n``'s state, in :meth:`past`'s order: ``past_key_values
        .N.key`` / ``.value``, ``past.N.indexer_key``, ``past.N.conv`` (several:
        ``past.N.conv.K``, K from 0), ``past.N.recurrent`` (``present.N.*`` when ``present``;
        the names onnxruntime-genai gives keys, values, convolution and recurrent states)."""
        kv, state = ("present", "present") if present else ("past_key_values", "past")
        convs = [f"{state}.{n}.conv.{k}" for k in range(len(self.convs()))] \
            if self.more_convs else [f"{state}.{n}.conv"] * bool(self.conv)
        return (*((f"{kv}.{n}.key", f"{kv}.{n}.value") if self.kv else ()),
                *((f"{state}.{n}.indexer_key",) if self.indexer else ()), *convs,
                *((f"{state}.{n}.recurrent",) if self.recurrent else ()),
                *(f"{state}.{n}.{s.name}" for s in self.named))

    def axes(self, batch: Any, length: Any) -> tuple[dict[int, Any], ...]:
        """Each :meth:`past` tensor's varying axes: keys, values and indexer keys' ``batch``
        and ``length``, the convolution and recurrent states' ``batch`` (their other sizes are
        the model's)."""
        return (*(({0: batch, 2: length},) * 2 if self.kv else ()),
                *(({0: batch, 1: length},) if self.indexer else ()),
                *(({0: batch},) * len(self.convs())),
                *(({0: batch},) if self.recurrent else ()),
                *({0: batch, 1: length} if s.grows else {0: batch} for s in self.named))

    def convs(self) -> tuple[tuple[int, int], ...]:
        """The (channels, width) of each convolution state the layer keeps."""
        return (self.conv, *self.more_convs) if self.conv else ()


def cache_layout(model: "torch.nn.Module") -> tuple[LayerCache, ...]:
    """Per layer, the shapes of the KV cache ``model`` itself returns for one token (config
    fields mean different things per family: multi-head latent attention, per-layer head
    sizes, multi-query). :class:`InputError` when the model's forward fails on one token or
    its cache holds a state other than keys and values, a convolution state, or one with a
    recurrent state."""
    import torch

    cache = model_cache(model)
    with states_in_cache(model) as moved:
        output = own_forward(model, torch.zeros(1, 1, dtype=torch.long), 1, cache,
                             "one token with a cache")
    if not any(_holds_tensors(v) for layer in getattr(cache, "layers", ())
               for v in _public(layer).values()):
        raise unused_cache(type(model).__name__, output, model.config)
    return layers_of(type(model).__name__, cache, scans=moved or bool(scan_modules(model)))


def unused_cache(name: str, output: Any, config: Any = None) -> InputError:
    """The refusal of a model whose forward left the cache it was given empty: GPT-1 keeps
    none; XLNet returns a memory of its own (``mems`` in ``output``) that no decode step can
    use (:func:`_memory_refusal`)."""
    own = [key for key, value in getattr(output, "items", dict)() if key != "logits"
           and _holds_tensors(value)]
    if own == ["mems"]:
        return _memory_refusal(name, config)
    kept = (f"it returns its own state instead ({', '.join(own)}), which --cache kv does not "
            "carry" if own else "it recomputes every token at each step")
    return InputError(f"{name} leaves the cache it is given empty (transformers' forward "
                      f"keeps no keys and values: {kept}): use --cache none for the prefill")


def _memory_refusal(name: str, config: Any) -> InputError:
    """XLNet's refusal: its ``mems`` are Transformer-XL's memory (each layer's input for
    earlier tokens); with bidirectional attention a call after that memory is not one call
    over all the tokens, and ``generate`` predicts from the query stream, re-running the
    last two tokens beside a placeholder each step: a limit of the model."""
    bidirectional = ("; its attention is bidirectional (attn_type 'bi'): a call after that "
                     "memory is not one call over all the tokens"
                     if getattr(config, "attn_type", None) == "bi" else "")
    return InputError(
        f"{name} keeps no cache to decode with, a limit of the model: it returns a memory "
        f"instead (mems, Transformer-XL's: each layer's input for the earlier "
        f"tokens){bidirectional}; transformers' generate predicts each token from a query "
        "stream fed a placeholder token, a permutation mask and a target mapping, re-running "
        "the last two tokens: use --cache none for the prefill")


def layers_of(name: str, cache: Any, scans: bool = False) -> tuple[LayerCache, ...]:
    """The shapes of the filled ``cache`` that ``name``'s forward returned, per layer (a
    layer holding nothing has none); :class:`InputError` for a layer holding a state other
    than keys and values or a convolution layer's (with its recurrent state if ``scans``:
    the model scans as :mod:`~rewrite.exporting.checkpoint.scans` traces), or a cache
    holding nothing."""
    import torch

    layers = []
    for n, layer in enumerate(getattr(cache, "layers", ())):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        kv = (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
              and keys.dim() == 4 and values.dim() == 4)
        # beside keys and values: carried with a traced scan's recurrent state only
        convs = conv_states(layer)  # beside keys and values too (Inkling)
        # carried with a traced scan only (a recurrence loops over the tokens)
        recurrent = recurrent_state(layer) if scans and (convs or not kv) else None
        if not kv and not convs and recurrent is None and not _keeps_nothing(layer):
            raise InputError(
                f"{name}: layer {n}'s cache is a {type(layer).__name__}, not keys and values: "
                "--cache kv exports key/value caches and convolution layers' states only "
                "(use --cache none for the prefill)")
        indexer = getattr(layer, "indexer_keys", None) if kv else None
        indexer = indexer if isinstance(indexer, torch.Tensor) and indexer.dim() == 3 else None
        named = getattr(layer, "named_states", None) or {}  # DeepSeek-V4's compressors'
        carried = ("keys", "values", "conv_states" if convs else "keys",
                   "recurrent_states" if recurrent is not None else "keys",
                   "indexer_keys" if indexer is not None else "keys", "named_states")
        beside = sorted(k for k, v in _public(layer).items()
                        if k not in carried and _holds_tensors(v))
        if beside:
            raise _beside_refusal(f"{name}: layer {n}'s cache ({type(layer).__name__})",
                                  beside, kv)
        shape = (keys.shape[1], keys.shape[3], values.shape[1], values.shape[3]) if kv \
            else (0, 0, 0, 0)
        layers.append(LayerCache(
            *shape, conv=convs[0].shape[1:] if convs else None, kv=kv,
            more_convs=tuple(conv.shape[1:] for conv in convs[1:]),
            recurrent=None if recurrent is None else tuple(recurrent.shape[1:]),
            recurrent_dtype=None if recurrent is None else recurrent.dtype,
            indexer=None if indexer is None else indexer.shape[2],
            named=tuple(NamedState(k, tuple(v.shape[1:]), v.dtype, grows(k))
                        for k, v in named.items())))
    if not any(layer.kv or layer.conv or layer.recurrent for layer in layers):
        raise InputError(f"{name} returned no key/value cache: use --cache none")
    return tuple(layers)


def _beside_refusal(what: str, beside: list[str], kv: bool) -> InputError:
    """The refusal of ``what`` (a model's layer's cache) keeping the states ``beside`` its
    keys and values (``kv``) or its convolution state."""
    return InputError(
        f"{what} keeps {', '.join(beside)} beside its "
        f"{'keys and values' if kv else 'convolution state'}: --cache kv carries keys and "
        "values, or a convolution layer's state (with a recurrent state where the model "
        "scans with transformers' mamba2_chunk_scan, mamba_selective_scan, a gated delta "
        "rule or Kimi's delta attention; use --cache none for the prefill)")


def _public(layer: Any) -> dict[str, Any]:
    """A cache layer's public attributes."""
    return {k: v for k, v in vars(layer).items() if not k.startswith("_")}


def _keeps_nothing(layer: Any) -> bool:
    """Whether ``layer`` is transformers' ``DummyLayer``, which stores nothing by design (a
    layer reading another's keys and values, Gemma 3n's). Another layer left empty (a model
    that keeps its state elsewhere, or none) is not taken for one."""
    from transformers import cache_utils

    dummy = getattr(cache_utils, "DummyLayer", None)
    return dummy is not None and type(layer) is dummy


def conv_states(layer: Any) -> tuple["torch.Tensor", ...]:
    """The convolution states ``[batch, channels, width]`` of a transformers linear-attention
    cache layer, in order (LFM2's one short convolution, Inkling's four), or none: not such a
    layer, or one of them unset."""
    import torch

    states = getattr(layer, "conv_states", None)
    found = [states.get(k) for k in range(len(states))] if isinstance(states, dict) else []
    return tuple(found) if found and all(isinstance(s, torch.Tensor) and s.dim() == 3
                                         for s in found) else ()


def recurrent_state(layer: Any) -> "torch.Tensor | None":
    """The one recurrent state of a transformers linear-attention cache layer (e.g. a Mamba-2
    layer's ``[batch, heads, head_dim, state]``), or None: it keeps none (LFM2's short
    convolutions) or several."""
    import torch

    states = getattr(layer, "recurrent_states", None)
    if not isinstance(states, dict) or len(states) != 1:
        return None
    state = states.get(0)
    return state if isinstance(state, torch.Tensor) else None


def filled_cache(model: "torch.nn.Module", past: list) -> Any:
    """A transformers ``DynamicCache`` holding ``past`` (per layer the tensors
    :meth:`LayerCache.past` lists): keys and values in full layers (a sliding window is the
    mask's), as :func:`cache_holding` makes them. With convolution states, the model's own
    cache's convolution layers (from its config) hold them (and their recurrent states), each
    a copy (the layer updates it in place) marked as following earlier tokens (zeros for the
    first step: the convolution's own left padding, no state before); a layer without a state
    stays the model's own."""
    from transformers.cache_utils import (
        DynamicIndexedLayer,
        DynamicLayer,
        DynamicSlidingWindowLayer,
        LinearAttentionAndFullAttentionLayer,
    )

    if all(len(tensors) == 2 and tensors[0].dim() == 4 for tensors in past):
        return cache_holding(past)
    cache = model_cache(model)
    for n, tensors in enumerate(past):
        own, names = cache.layers[n], state_names(model, n)
        if names:  # keys and values in a full layer, then DeepSeek-V4's compressor states
            cache.layers[n] = holding(DynamicLayer(), *tensors[:2])
            cache.layers[n].named_states = dict(zip(names, tensors[2:]))
            continue
        states = hasattr(own, "conv_states")  # a linear-attention layer
        if tensors and states and isinstance(own, DynamicLayer):
            if isinstance(own, DynamicSlidingWindowLayer):  # the window is the mask's
                own = cache.layers[n] = LinearAttentionAndFullAttentionLayer(
                    number_of_states=own.number_of_states)
            holding(own, *tensors[:2])  # keys and values beside states (Falcon-H1, Inkling)
            holding_states(own, *tensors[2:])
        elif tensors and states:  # a convolution and a recurrent state, or one of them
            holding_states(own, *tensors)
        elif tensors:  # keys and values, maybe indexer keys
            empty = DynamicIndexedLayer() if len(tensors) == 3 else DynamicLayer()
            cache.layers[n] = holding(empty, *tensors)
    return cache


def holding_states(layer: Any, *states: "torch.Tensor", copy: bool = True) -> None:
    """A linear-attention cache ``layer`` holding copies of ``states`` (the tensors when not
    ``copy``), marked as following earlier tokens (:func:`filled_cache`): its convolution
    states (3-d, as many as its ``number_of_states``: Inkling's four), then a recurrent
    state; or a recurrent state alone (MiniMax's lightning attention)."""
    convs = states[:layer.number_of_states] if states and states[0].dim() == 3 else ()
    for k, conv in enumerate(convs):
        layer.conv_states[k] = conv.clone() if copy else conv
        layer.conv_kernel_size[k] = conv.shape[-1]
        layer.is_conv_states_initialized[k] = layer.has_previous_state[k] = True
    for recurrent in states[len(convs):]:
        layer.recurrent_states[0] = recurrent.clone() if copy else recurrent
        layer.is_recurrent_states_initialized[0] = True
    if states:
        layer.dtype, layer.device = states[0].dtype, states[0].device


def layer_state(layer: Any) -> tuple["torch.Tensor", ...]:
    """A filled cache layer's state in :meth:`LayerCache.past`'s order: its keys and values
    (and indexer keys, or named states), or a convolution layer's state (and its recurrent
    state); a transformers DeepSeek-V4 layer's as the graph keeps it, None where it keeps
    no such state (:func:`~rewrite.exporting.checkpoint.compressed.eager_states`)."""
    import torch

    named = getattr(layer, "named_states", None)
    if named:
        return (layer.keys, layer.values, *named.values())
    compressed = eager_states(layer)
    if compressed is not None:
        return compressed
    keys, indexer = getattr(layer, "keys", None), getattr(layer, "indexer_keys", None)
    recurrent = recurrent_state(layer)
    states = (*conv_states(layer), *(() if recurrent is None else (recurrent,)))
    if isinstance(keys, torch.Tensor):
        indexed = (indexer,) if isinstance(indexer, torch.Tensor) else ()
        return (keys, layer.values, *indexed, *states)
    return states


def own_forward(model: "torch.nn.Module", ids: "torch.Tensor", total: int, cache: Any,
                situation: str, positions: bool = False, new_only: bool = False) -> Any:
    """The class's forward as a user calls it: ``ids`` after ``total - len(ids)`` cached
    tokens, all attended (``new_only``: the mask of ``ids`` alone, :func:`new_tokens_mask`),
    no positions given (``positions``: the documented ones, as the model numbers them),
    ``cache`` (None: no cache). The model's own failure is an :class:`InputError` naming
    ``situation`` (the error rule: :func:`~rewrite.errors.library_call`)."""
    import torch

    mask = torch.ones(1, ids.shape[1] if new_only else total, dtype=torch.long)
    keywords: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if positions:
        keywords["position_ids"] = model_positions(
            model, torch.arange(total - ids.shape[1], total)[None])
    keyword = cache_keyword(model)
    if cache is not None:  # RWKV: transformers' own code on its own state list
        keywords.update(use_cache=True, **{keyword: listed_state(cache) if keyword == "state"
                                           else cache})
    else:
        keywords["use_cache"] = False
    out = model_call(model, keywords, situation)
    if cache is not None and keyword == "state":
        keep_listed_state(cache, out.state)
    return out


def model_call(model: "torch.nn.Module", keywords: dict[str, Any], situation: str) -> Any:
    """The class's forward on ``keywords``, without gradients; the model's own failure is an
    :class:`InputError` naming ``situation`` (:func:`~rewrite.errors.library_call`)."""
    import torch

    name = type(model).__name__

    def failed(e: BaseException) -> InputError:
        return InputError(f"{name}'s own forward failed on {situation}, before any export: "
                          f"{type(e).__name__}: {first_line(e)}")

    with library_call("transformers", f"running {name}", failed), torch.no_grad():
        return type(model).forward(model, **keywords)


def _holds_tensors(value: Any) -> bool:
    """Whether ``value`` is a tensor, or a dict, list or tuple holding one (a cache layer's
    state: Mamba's and linear attention's convolution and recurrent states are dicts)."""
    import torch

    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


def model_cache(model: "torch.nn.Module") -> Any:
    """An empty ``DynamicCache`` for ``model`` (per-layer kinds, such as sliding windows, from
    its config), in the model's own cache class where it requires one
    (:func:`~rewrite.exporting.checkpoint.module_states.own_cache`)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x: no config argument
        return DynamicCache()
    return rwkv_cache(model, own_cache(model, cache))


def causal_lm_call(model: "torch.nn.Module", layout: tuple[LayerCache, ...] | None) -> Call:
    """Example inputs, dynamic shapes and I/O names: with a cache (``layout``, the model's own:
    :func:`cache_layout`) decode-ready, without it the prefill; the example cache in the
    model's dtype (a bf16 checkpoint keeps a bf16 cache)."""
    import torch
    from torch.export import Dim

    config = model.config
    batch, sequence = Dim("batch_size"), Dim("sequence_length")
    named = {0: "batch_size", 1: "sequence_length"}
    b, s, p = EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST if layout is not None else 0
    vocab = config.get_text_config(decoder=True).vocab_size
    args: list = [torch.randint(0, vocab, (b, s)), torch.ones(b, p + s, dtype=torch.long),
                  torch.arange(p, p + s).repeat(b, 1)]
    # the mask's length is named in ``names`` only: as a named Dim, torch.export refuses
    # the lower bound it guards (the example's past length)
    shapes: list = [{0: batch, 1: sequence}, {0: batch, 1: Dim.DYNAMIC},
                    {0: batch, 1: sequence}]
    names: list = [named, {0: "batch_size", 1: "total_sequence_length"}, named]
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    if layout is not None:
        past = Dim("past_sequence_length")
        args.append([layer.past(b, p, model.dtype) for layer in layout])
        shapes.append([layer.axes(batch, past) for layer in layout])
        names.append([layer.axes("batch_size", "past_sequence_length") for layer in layout])
        inputs += [name for n, layer in enumerate(layout) for name in layer.names(n)]
        outputs += [name for n, layer in enumerate(layout) for name in layer.names(n, True)]
    return Call(tuple(args), tuple(shapes), tuple(inputs), tuple(outputs), tuple(names),
                decode_forward, position_offset(model))


def position_offset(model: "torch.nn.Module") -> int:
    """The model's first position when ``position_ids`` are not given: RoBERTa's family
    (RoBERTa, XLM-RoBERTa, CamemBERT, Data2Vec-Text...) numbers tokens from
    ``padding_idx + 1`` (its embeddings' ``create_position_ids_from_input_ids``); 0 for
    every other model. The exported graph adds it to the ``position_ids`` it is fed."""
    offsets = {module.padding_idx + 1 for module in model.modules()
               if hasattr(module, "create_position_ids_from_input_ids")
               and isinstance(getattr(module, "padding_idx", None), int)}
    if len(offsets) > 1:
        raise InputError(f"{type(model).__name__} numbers positions from several padding "
                         f"indices ({', '.join(str(o - 1) for o in sorted(offsets))})")
    return offsets.pop() if offsets else 0


def model_positions(model: "torch.nn.Module", position_ids: "torch.Tensor"
                    ) -> "torch.Tensor":
    """``position_ids`` (from 0, as documented) as ``model`` numbers them
    (:func:`position_offset`); unchanged, no node added, for a model that counts from 0."""
    offset = position_offset(model)
    return position_ids + offset if offset else position_ids


def decode_forward(self: "torch.nn.Module", input_ids: "torch.Tensor",
                   attention_mask: "torch.Tensor", position_ids: "torch.Tensor",
                   past_key_values: list | None = None) -> tuple:
    """The model's forward with the cache as tensors: ``(logits, [(key, value), ...])``,
    or ``(logits,)`` without a past (a hybrid's layers: :func:`filled_cache`)."""
    cls_forward = type(self).forward
    position_ids = model_positions(self, position_ids)
    if past_key_values is None:
        out = cls_forward(self, input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False)
        return (out.logits,)
    if new_tokens_mask(past_key_values):
        attention_mask = attention_mask[:, -input_ids.shape[1]:]
    cache = filled_cache(self, past_key_values)
    out = cls_forward(self, input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, use_cache=True, **{cache_keyword(self): cache})
    return out.logits, [layer_state(layer) for layer in cache.layers]


def new_tokens_mask(past: "list | tuple[LayerCache, ...]") -> bool:
    """Whether a model of the cache ``past`` (tensors per layer, or its layout) reads its
    ``attention_mask`` as the new tokens' alone: one that never attends (Mamba, Falcon-Mamba:
    the mask only zeroes padded tokens' inputs, and transformers' ``generate`` gives it none
    after the prompt). The graph takes the documented mask of every token and keeps its last
    ``sequence_length`` columns."""
    return bool(past) and not any(
        layer.kv if isinstance(layer, LayerCache) else layer and layer[0].dim() == 4
        for layer in past)


def cache_holding(pairs: "Iterable[tuple[torch.Tensor, torch.Tensor]]") -> Any:
    """A ``DynamicCache`` whose layers hold ``pairs`` (keys, values) as they are.

    ``DynamicCache(pairs)`` concatenates each pair onto an empty tensor: under torch.export,
    two traced ops per layer with symbolic sizes to reason about (about a third of what the
    export of a deep model spends growing with its depth, profiled) for a graph they leave
    unchanged once folded. The layers are made filled instead."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    cache.layers.extend(holding(DynamicLayer(), key, value) for key, value in pairs)
    return cache


def holding(layer: Any, key: "torch.Tensor", value: "torch.Tensor",
            indexer: "torch.Tensor | None" = None) -> Any:
    """``layer`` (an empty ``DynamicLayer``, or ``DynamicIndexedLayer`` with ``indexer``)
    holding the tensors as they are: what its lazy initializations set, without their empty
    tensors (:func:`cache_holding`)."""
    layer.device, layer.dtype, layer.keys, layer.values = key.device, key.dtype, key, value
    layer.is_initialized = True
    if indexer is not None:
        layer.indexer_dtype, layer.indexer_device = indexer.dtype, indexer.device
        layer.indexer_keys, layer.is_indexer_initialized = indexer, True
    return layer


def cache_keyword(model: "torch.nn.Module") -> str:
    """``cache`` (transformers 5) or ``past_key_values`` (4.x): how forward takes the cache;
    ``state`` where it takes a state list of its own (RWKV's:
    :func:`~rewrite.exporting.checkpoint.module_states.rwkv_cache`)."""
    parameters = inspect.signature(type(model).forward).parameters
    return next((k for k in ("cache", "state") if k in parameters), "past_key_values")


@contextlib.contextmanager
def calling(model: "torch.nn.Module", call: Call) -> Iterator["torch.nn.Module"]:
    """``model`` with ``call``'s forward as its forward while the block runs (and its scans
    as torch.export traces them: :func:`~rewrite.exporting.checkpoint.scans.traced_scans`)."""
    model.forward = types.MethodType(call.forward, model)
    try:
        with traced_scans(model), states_in_cache(model):
            yield model
    finally:
        del model.forward
