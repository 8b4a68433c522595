"""The last stage: the finishing passes (:mod:`finishing._passes`) run over the outlined
model, and what they merged applied to the outlining's result."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from rewrite._shared.gc import gc_paused
from rewrite.backends.onnx.finishing._passes import (
    DropBodyNodeNames,
    Finishing,
    FixOpsets,
    FuseAttention,
    InitializersInFirstUseOrder,
    MergeEqualFunctions,
    MergeScalarVariants,
    OptimizeBodies,
    PackProjections,
    PortableStackTraces,
    run_passes,
)
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining import Outlined

if TYPE_CHECKING:
    from rewrite.grouping import GroupTree


def finish(model: ir.Model, tree: GroupTree, outlined: Outlined, options: OnnxOptions,
           optimized: bool) -> Outlined:
    """Finish the outlined ``model`` with the passes of :mod:`finishing._passes`, in one
    ``Sequential``: when it is optimized, its scalar variants merged first (bodies equal up to
    a scalar share one function reading an attribute: the optimizer cannot fold a scale of
    1.0 in one of them away and leave it apart), then optimized; functions with equal bodies
    merged (folding can make bodies equal), opsets fixed, initializers in first-use order,
    stack traces' source paths relative to their import root, body nodes unnamed if asked.
    ``outlined`` with merged functions replaced and, for each body the last merge kept apart
    from its identity's first, why (:mod:`distinct`)."""
    records = tree.records
    identity = {fid: (records[k].domain, records[k].function_name)  # type: ignore[union-attr]
                for k, fid in outlined.by_group.items() if fid is not None}
    state = Finishing(identity, outlined.functions)
    lift = options.constants != "embed"
    passes: list[ir.passes.PassBase] = []
    if optimized:
        if lift:  # scalar variants first: a function attribute is not folded away
            passes.append(MergeScalarVariants(state))
        passes.append(OptimizeBodies(state, options.fold_weights))
        if options.fuse_attention:
            passes.append(FuseAttention(state, options.onnxruntime_ops))
        if options.pack_projections:
            passes.append(PackProjections(state))
    passes += [MergeEqualFunctions(state, lift), FixOpsets(state, model.opset_imports),
               InitializersInFirstUseOrder(), PortableStackTraces()]
    if not options.body_node_names:
        passes.append(DropBodyNodeNames(state))
    with gc_paused():
        run_passes(model, passes)
    merged = state.merged
    by_group = {k: merged.get(fid, fid) if fid is not None else None
                for k, fid in outlined.by_group.items()}
    variants = state.variants.renamed(merged) if state.variants is not None else ()
    return Outlined(by_group, state.functions, outlined.recomputed, outlined.ids, variants)
