"""Options of the ONNX backend."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from attrs import field, frozen, validators

CONSTANT_POLICIES = ("attribute", "embed", "input")
LOWERINGS = ("auto", "per-body", "flat")

EXTERNAL_DATA_THRESHOLD = 2**28
"""Tensor bytes above which ``save_onnx`` writes external data: 256 MiB. External data is
copied file to file (memory flat in model size); embedded weights are serialized in memory
(about twice their size) and cannot exceed 2 GiB (protobuf). Small models stay one file."""


ONNXRUNTIME_OPS = ("GroupQueryAttention", "SkipSimplifiedLayerNormalization")
"""What ``OnnxOptions.onnxruntime_ops`` may name."""


@frozen
class OnnxOptions:
    """How groups are lowered to ONNX functions.

    ``constants``: what a function does with a small constant it reads from outside (an
    initializer the export or its optimizer made, not a parameter or buffer, with at most
    ``constant_limit`` elements, or a ``Constant`` node's value):

    * ``"attribute"`` (default): a ``Constant`` node inside the function; modules whose bodies
      differ only in scalars (an ``eps``, a scale: a float op attribute or a one-element
      floating-point constant) share one function that reads a function attribute where they
      differ, each call giving its value (see ``finishing._merge``).
    * ``"embed"``: a ``Constant`` node inside the function. The value is part of the
      function's body, so modules that differ only in such a constant get separate
      functions (``Name``, ``Name_1``).
    * ``"input"``: a function input like a weight, so such modules share one function; a
      scalar that cannot be an input (a float attribute of an op, like
      ``LayerNormalization.epsilon``) becomes a function attribute as under ``"attribute"``.

    Parameters and buffers are always function inputs, and so are larger constants (a causal
    mask): onnxruntime inlines functions, and a constant embedded in a function called 48
    times would become 48 copies, where one shared initializer serves every call.
    """

    constants: str = field(default="attribute", validator=validators.in_(CONSTANT_POLICIES))
    constant_limit: int = field(default=64, validator=validators.ge(0))
    recompute: bool = True
    """Recompute small shared computations per group (see ``outlining._recompute``)
    so dedup survives CSE."""
    optimize: bool = True
    """Optimize with torch.onnx's optimizer (onnxscript's), after outlining: once per distinct
    function body and once over the main graph (``.pt2`` / ExportedProgram input; an ``.onnx``
    input is outlined as it is). ``False`` gives the export's unoptimized ops."""
    fold_weights: bool = True
    """``False``: the optimizer of the main graph folds no ``Transpose`` of a weight into a
    transposed copy (onnxscript folds one of any size when the ``Transpose`` is its only
    reader: an untied LM head), so every weight stays the input's bytes, a range of the
    input file; onnxruntime transposes it once when it loads the model. ``rewrite export``
    (a checkpoint folder) sets it."""
    fuse_attention: bool = False
    """After optimizing, each function body's attention (torchlib's
    ``scaled_dot_product_attention``, transformers' ``repeat_kv`` before it, the key cache's
    ``Concat``) as one opset-23 ``Attention`` node and its rotary embeddings as
    ``RotaryEmbedding``, on the 3-D projections, once per distinct body; the model then
    imports opset 23 (``finishing._attention``, ``finishing._rotary``). ``rewrite export`` of
    a checkpoint folder sets it."""
    onnxruntime_ops: tuple[str, ...] = field(
        default=(), validator=validators.deep_iterable(validators.in_(ONNXRUNTIME_OPS)))
    """With ``fuse_attention``: onnxruntime's ``com.microsoft`` ops written in the bodies, once
    per distinct body, of :data:`ONNXRUNTIME_OPS`: ``"GroupQueryAttention"`` for the fused
    attention (a causal model without a sliding window), ``"SkipSimplifiedLayerNormalization"``
    for a residual add read by an RMSNorm (``finishing._contrib``). Other runtimes do not
    read them. ``rewrite export --target onnxruntime`` sets them."""
    pack_projections: bool = False
    """After optimizing, the ``MatMul`` of each function body reading one input by weights
    the function takes (a layer's query, key and value projections; an MLP's gate and up) as
    one ``MatMul`` by the weights concatenated when written, then a ``Split``, once per
    distinct body (``finishing._pack``). ``rewrite export`` of a checkpoint folder sets it."""
    custom_translation_table: Mapping[Callable, Callable | Sequence[Callable]] | None = field(
        default=None, eq=False)
    """Translations of ops torch.onnx does not know (custom ops) into ONNX ops of any domain,
    as ``torch.onnx.export(custom_translation_table=...)`` takes them (both lowerings use
    them); nodes of other domains may sit inside functions, and every function and the model
    import the domains they use."""
    lowering: str = field(default="auto", validator=validators.in_(LOWERINGS))
    """How a ``.pt2`` / ExportedProgram becomes ONNX ops (see ``perbody``): ``"per-body"``
    decomposes and translates each distinct repeated body once (an error when the program
    cannot take that path), ``"flat"`` runs ``torch.onnx.export`` on the whole flat program,
    ``"auto"`` (default) tries per-body and falls back to flat with one warning naming why."""
    body_node_names: bool = True
    """``False``: the nodes inside the functions rewrite makes have no names (the main graph's
    keep theirs). onnxruntime names every node it inlines from a function
    ``_inlfunc_<function>_<node>``, and 1.32 pays on every run for each node name longer than
    15 characters (about 2% of the 48-block GPT-2's latency, see bench/RESULTS.md); nodes of
    unnamed bodies stay unnamed there. Their ``namespace`` / ``name_scopes`` metadata stays."""
    check_weights: bool = True
    """Start checking the mapped ``.pt2``'s weights (checksums, on a thread) when lowering
    begins, for the writer to wait on (``files.mapped``). ``False`` for a lowering whose weights
    are never handed on (``rewrite lock`` / ``verify`` / ``diff``): no weight is read."""
    external_data_threshold: int = field(default=EXTERNAL_DATA_THRESHOLD,
                                         validator=validators.ge(0))
    """``save_onnx`` writes weights to ``OUT.onnx.data`` when they exceed this many bytes."""
    weights_chunk: int | None = field(default=None, validator=validators.optional(
        validators.gt(0)))
    """At most this many bytes per external data file (numbered chunks; a larger tensor gets
    a file of its own); implies external data. None: one ``OUT.onnx.data``."""
