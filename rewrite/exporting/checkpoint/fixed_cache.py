"""``--cache static``: a KV cache of fixed length, written in place, for compilers that want
every step to have the same shapes (NPU stacks: QEfficient, QNN, Intel's NPU plugin).

    inputs   input_ids [batch_size, sequence_length],
             position_ids [batch_size, sequence_length],
             attention_mask [batch_size, C]   (1 where a slot holds a real token, the new
                                               ones included),
             past_key_values.N.key / .value [batch_size, kv_heads, C, head_dim]
    outputs  logits [batch_size, sequence_length, vocab],
             present.N.key / .value [batch_size, kv_heads, C, head_dim]   (the whole buffer)

A token's slot is its position: each layer writes the new keys and values at
``position_ids`` (``ScatterElements``; a position of -1, a left pad, writes to a spare slot
that is dropped) and attends over the whole buffer under a mask built once, outside the
layers, from ``attention_mask`` and the positions (causal: slot <= position; a sliding-window
layer also slot > position - window). The rotary tables are the model's own, computed once.
The cache and the mask are rewrite's (:class:`FixedCache`, :func:`slot_masks`): the model's
code is not changed; each decoder layer's function takes its layer's buffers and returns
the updated ones.

With ``--static`` every size is fixed; several ``seq`` (:func:`chunk_lengths`) make one
model each, the first at the output, the others beside it (``OUT_seq1.onnx``) reading its
data file (:mod:`rewrite.backends.onnx.shared_data`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from rewrite.errors import InputError
from rewrite.exporting.twin import SLOTS, TOKENS, Twin
from rewrite.exporting.checkpoint.cache import (
    EXAMPLE_BATCH,
    EXAMPLE_SEQUENCE,
    Call,
    LayerCache,
    cache_keyword,
    model_positions,
    position_offset,
)

if TYPE_CHECKING:
    import torch

FULL, SLIDING = "full_attention", "sliding_attention"


def _dynamic_cache() -> type:
    from transformers import DynamicCache

    return DynamicCache


class FixedCache(_dynamic_cache()):  # a transformers Cache, for the models that check
    """Per layer a buffer of keys and one of values, ``[batch, heads, C, dim]``; ``update``
    writes the new ones at the tokens' positions and returns the whole buffers."""

    def __init__(self, buffers: list, positions: "torch.Tensor") -> None:
        super().__init__()
        self.buffers = [list(pair) for pair in buffers]
        self.positions = positions

    def update(self, key_states: "torch.Tensor", value_states: "torch.Tensor",
               layer_idx: int, *args: Any, **kwargs: Any) -> tuple:
        keys, values = self.buffers[layer_idx]
        keys = write_at(keys, key_states, self.positions)
        values = write_at(values, value_states, self.positions)
        self.buffers[layer_idx] = [keys, values]
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.buffers[layer_idx][0].shape[2]


def write_at(buffer: "torch.Tensor", new: "torch.Tensor", positions: "torch.Tensor"
             ) -> "torch.Tensor":
    """``buffer`` ``[B, H, C, D]`` with ``new`` ``[B, H, S, D]`` written at slots
    ``positions`` ``[B, S]``; positions < 0 write to a spare slot, dropped."""
    import torch

    b, h, c, d = buffer.shape
    slots = torch.where(positions < 0, torch.full_like(positions, c), positions)
    index = slots[:, None, :, None].expand(b, h, slots.shape[1], d)
    spare = torch.cat([buffer, buffer.new_zeros(b, h, 1, d)], dim=2)
    return spare.scatter(2, index, new)[:, :, :c]


def slot_masks(config: Any, attention_mask: "torch.Tensor", position_ids: "torch.Tensor",
               dtype: "torch.dtype") -> "torch.Tensor | dict":
    """The additive masks ``[B, 1, S, C]``: 0 where a query may attend a slot, the dtype's
    lowest value elsewhere (never -inf: a pad's query attends nothing and must not give NaN);
    one per layer type (full, sliding window) where the model has several."""
    import torch

    context = attention_mask.shape[1]
    slots = torch.arange(context, device=attention_mask.device)[None, None, None, :]
    query = position_ids[:, None, :, None]
    allowed = attention_mask[:, None, None, :].bool() & (slots <= query)
    low = torch.finfo(dtype).min

    def additive(where: "torch.Tensor") -> "torch.Tensor":
        return torch.where(where, torch.zeros((), dtype=dtype), torch.full((), low, dtype=dtype))

    kinds = set(getattr(config, "layer_types", None) or ())
    if SLIDING not in kinds:
        return additive(allowed)
    window = config.sliding_window
    masks = {SLIDING: additive(allowed & (slots > query - window))}
    if FULL in kinds:
        masks[FULL] = additive(allowed)
    return masks


def check_layer_kinds(model: "torch.nn.Module") -> None:
    """:class:`InputError` for a model whose layers attend in a way a fixed buffer under one
    mask per kind cannot express (chunked attention, linear attention...)."""
    config = model.config.get_text_config(decoder=True)
    kinds = set(getattr(config, "layer_types", None) or ()) - {FULL, SLIDING}
    if kinds:
        raise InputError(f"{type(model).__name__}: --cache static covers full and sliding-"
                         f"window attention; its layers also use {', '.join(sorted(kinds))}")


def check_states(model: "torch.nn.Module", layout: tuple[LayerCache, ...]) -> None:
    """:class:`InputError` for a hybrid: layers keeping a convolution (and a recurrent)
    state, which :class:`FixedCache` does not carry."""
    compressing = [n for n, layer in enumerate(layout) if layer.named]
    if compressing:
        raise InputError(
            f"{type(model).__name__}: --cache static keeps keys and values in fixed buffers; "
            f"layers {', '.join(map(str, compressing))} keep a compressor's states, which "
            "rewrite's fixed cache does not carry (use --cache kv)")
    held = [n for n, layer in enumerate(layout) if layer.conv]
    if held:
        states = "a convolution and a recurrent state" if any(
            layout[n].recurrent for n in held) else "a convolution state"
        raise InputError(
            f"{type(model).__name__}: --cache static keeps keys and values in fixed buffers; "
            f"layers {', '.join(map(str, held))} keep {states}, which rewrite's fixed cache "
            "does not carry yet (their sizes are fixed already: with --cache kv only the "
            "attention layers' keys and values grow)")


def chunk_lengths(static: Mapping[str, Any]) -> tuple[int, ...]:
    """The chunk lengths ``static["seq"]`` asks for (one size or several), in order; none
    when it asks none. :class:`InputError` for one that is not a positive int."""
    seq = static.get("seq")
    seqs = () if seq is None else (seq,) if isinstance(seq, int) else tuple(seq)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in seqs):
        raise InputError(f"--static seq={seq!r}: chunk lengths are positive numbers")
    return seqs


def check_chunks(static: Mapping[str, Any], context: int | None) -> None:
    """:class:`InputError` for a chunk length asked twice or longer than ``context``."""
    seqs = chunk_lengths(static)
    twice = [s for n, s in enumerate(seqs) if s in seqs[:n]]
    if twice:
        raise InputError(f"--static asks seq={twice[0]} twice: one model per chunk length")
    longer = [s for s in seqs if context is not None and s > context]
    if longer:
        raise InputError(f"the chunk ({longer[0]} tokens) is longer than the context "
                         f"({context})")


def fixed_cache_call(model: "torch.nn.Module", layout: tuple[LayerCache, ...],
                     context: int, static: Mapping[str, int] | None = None) -> Call:
    """Example inputs, shapes and names of the fixed-cache convention (the module
    docstring); batch and sequence dynamic unless ``static`` fixes them (``batch``, one
    ``seq``)."""
    import torch
    from torch.export import Dim

    check_states(model, layout)
    check_layer_kinds(model)
    static = static or {}
    b = static.get("batch", EXAMPLE_BATCH)
    s = static.get("seq", EXAMPLE_SEQUENCE)
    check_chunks(static, context)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    mask = torch.zeros(b, context, dtype=torch.long)
    mask[:, :s] = 1
    args: list = [torch.randint(0, vocab, (b, s)), mask, torch.arange(s).repeat(b, 1),
                  [layer.unwritten(b, context, model.dtype) for layer in layout]]
    batch = "batch" not in static and Dim("batch_size")
    sequence = "seq" not in static and Dim("sequence_length")
    tokens = {k: v for k, v in ((0, batch), (1, sequence)) if v}
    kv = {0: batch} if batch else {}
    shapes: list = [tokens, dict(kv), tokens, [(kv, kv) for _ in layout]]
    named = {k: {0: "batch_size", 1: "sequence_length"}[k] for k in tokens}
    named_kv = {0: "batch_size"} if batch else {}
    names: list = [named, dict(named_kv), named, [(named_kv, named_kv) for _ in layout]]
    entries = [f"{n}.{kv}" for n in range(len(layout)) for kv in ("key", "value")]
    return Call(tuple(args), tuple(shapes),
                ("input_ids", "attention_mask", "position_ids",
                 *[f"past_key_values.{e}" for e in entries]),
                ("logits", *[f"present.{e}" for e in entries]), tuple(names), fixed_forward,
                position_offset(model))


def fixed_cache_twin(model: "torch.nn.Module", layout: tuple[LayerCache, ...], context: int,
                     static: Mapping[str, Any]) -> Twin:
    """The fixed-cache call's :class:`~rewrite.exporting.twin.Twin`: over
    :data:`~rewrite.exporting.twin.SLOTS` slots (at most ``context``), one row of
    :data:`~rewrite.exporting.twin.TOKENS` tokens where ``static`` fixes batch and chunk (a
    dynamic size as the export's example has it)."""
    slots = min(context, SLOTS)
    sizes = {"batch": 1, "seq": min(TOKENS, slots)}
    return Twin(fixed_cache_call(model, layout, slots,
                                 {k: v for k, v in sizes.items() if k in static}).args)


def fixed_forward(self: "torch.nn.Module", input_ids: "torch.Tensor",
                  attention_mask: "torch.Tensor", position_ids: "torch.Tensor",
                  past_key_values: list) -> tuple:
    """The model's forward over a fixed cache: ``(logits, [(key, value), ...])``."""
    cache = FixedCache(past_key_values, position_ids)
    config = self.config.get_text_config(decoder=True)
    masks = slot_masks(config, attention_mask, position_ids, self.dtype)
    out = type(self).forward(self, input_ids=input_ids, attention_mask=masks,
                             position_ids=model_positions(self, position_ids), use_cache=True,
                             **{cache_keyword(self): cache})
    return out.logits, [tuple(pair) for pair in cache.buffers]
