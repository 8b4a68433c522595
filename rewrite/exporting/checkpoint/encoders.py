"""What ``torch.export`` is given for a text model that is not a causal LM: an encoder (BERT,
a classifier head over any body) or an encoder-decoder (BART, T5), prefill only (an
encoder-decoder decode-ready: :mod:`rewrite.exporting.checkpoint.seq2seq`).

    encoder          inputs  input_ids, attention_mask [batch_size, sequence_length]
                             (and token_type_ids, where the model's forward takes them)
    encoder-decoder  inputs  input_ids, attention_mask [batch_size, encoder_sequence_length],
                             decoder_input_ids [batch_size, decoder_sequence_length]
    outputs          the tensors of the model's own output, by its names (``logits``,
                     ``last_hidden_state``, ``encoder_last_hidden_state``...)

The output names are read from one eager call on the example inputs (a few tokens). The
model's forward is replaced on the instance while exporting, as for causal LMs
(:func:`rewrite.exporting.checkpoint.cache.calling`), so module paths and weight names stay the
checkpoint's.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from rewrite.exporting.checkpoint.cache import EXAMPLE_BATCH, Call
from rewrite.errors import InputError

if TYPE_CHECKING:
    import torch

EXAMPLE_TOKENS = 5


def takes_text(cls: type) -> bool:
    """Whether ``cls``'s forward takes ``input_ids`` (a text model)."""
    return "input_ids" in inspect.signature(cls.forward).parameters


def encoder_call(model: "torch.nn.Module") -> Call:
    """Example inputs, dynamic shapes and I/O names of an encoder or an encoder-decoder."""
    import torch
    from torch.export import Dim

    config = model.config
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    taken = inspect.signature(type(model).forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in taken and not seq2seq:
        names.append("token_type_ids")
    if seq2seq:
        names.append("decoder_input_ids")
    vocab = config.get_text_config().vocab_size
    batch, b, s = Dim("batch_size"), EXAMPLE_BATCH, EXAMPLE_TOKENS
    sequence = "encoder_sequence_length" if seq2seq else "sequence_length"
    args = {"input_ids": torch.randint(0, vocab, (b, s)),
            "attention_mask": torch.ones(b, s, dtype=torch.long),
            "token_type_ids": torch.zeros(b, s, dtype=torch.long),
            "decoder_input_ids": torch.randint(0, vocab, (b, s - 1))}
    axes = {name: {0: "batch_size", 1: sequence} for name in names}
    if seq2seq:
        axes["decoder_input_ids"] = {0: "batch_size", 1: "decoder_sequence_length"}
    dims = {name: Dim(name, **sequence_bound(config)) for name in {a[1] for a in axes.values()}}
    shapes = tuple({0: batch, 1: dims[axes[name][1]]} for name in names)
    example = tuple(args[name] for name in names)
    outputs = _output_names(model, dict(zip(names, example)))
    return Call(example, shapes, tuple(names), outputs, tuple(axes[name] for name in names),
                _forward(names, outputs))


def sequence_bound(config: Any) -> dict[str, int]:
    """``Dim``'s bound on a sequence's length: the model's learned positions, if any."""
    longest = getattr(config.get_text_config(), "max_position_embeddings", None)
    return {"max": longest} if isinstance(longest, int) else {}


def _output_names(model: "torch.nn.Module", inputs: dict) -> tuple[str, ...]:
    """The names of the tensors the model returns (one eager call on the example)."""
    import torch

    with torch.no_grad():
        out = _called(model, inputs)
    names = tuple(k for k, v in out.items() if isinstance(v, torch.Tensor))
    if not names:
        raise InputError(f"{type(model).__name__} returns no tensor from its inputs")
    return names


def _called(model: "torch.nn.Module", inputs: dict) -> Any:
    """The class's forward on ``inputs``, its output as a dict, no cache kept."""
    keywords: dict[str, Any] = {**inputs, "return_dict": True}
    if "use_cache" in inspect.signature(type(model).forward).parameters:
        keywords["use_cache"] = False
    return type(model).forward(model, **keywords)


def _forward(names: list[str], outputs: tuple[str, ...]) -> Callable[..., tuple]:
    """A forward taking ``names`` positionally (``input_ids``, ``attention_mask``, then
    ``token_type_ids`` or ``decoder_input_ids`` when there is a third) and returning the
    ``outputs`` tensors. Its parameters are named: torch.export matches the dynamic shapes
    to them."""

    def forward(self: "torch.nn.Module", input_ids: "torch.Tensor",
                attention_mask: "torch.Tensor", third: "torch.Tensor | None" = None) -> tuple:
        out = _called(self, dict(zip(names, (input_ids, attention_mask, third))))
        return tuple(out[name] for name in outputs)

    return forward
