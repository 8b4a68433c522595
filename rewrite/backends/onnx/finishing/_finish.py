"""The last stage: the outlined model optimized, equal functions merged, opsets fixed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from rewrite._gc import gc_paused
from rewrite.backends.onnx._opsets import fix_opsets
from rewrite.backends.onnx.distinct import Variants
from rewrite.backends.onnx.finishing._merge import merge_functions
from rewrite.backends.onnx.finishing._optimize import optimize
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining import Outlined, drop_node_names

if TYPE_CHECKING:
    from rewrite.grouping import GroupTree


def finish(model: ir.Model, tree: GroupTree, outlined: Outlined, options: OnnxOptions,
           optimized: bool) -> Outlined:
    """Merge the functions of the outlined ``model`` (:mod:`finishing._merge`): when it is
    optimized, its scalar variants first (bodies equal up to a scalar share one function
    reading an attribute: the optimizer cannot fold a scale of 1.0 in one of them away and
    leave it apart), then optimize, then merge again (folding can make bodies equal); unname
    their nodes if asked. ``outlined`` with merged functions replaced and, for each body the
    last merge kept apart from its identity's first, why (:mod:`distinct`)."""
    records = tree.records
    identity = {fid: (records[k].domain, records[k].function_name)  # type: ignore[union-attr]
                for k, fid in outlined.by_group.items() if fid is not None}
    exported_opsets = dict(model.opset_imports)
    lift = options.constants != "embed"
    with gc_paused():
        merged: dict = {}
        if optimized:
            if lift:  # scalar variants first: a function attribute is not folded away
                merged = merge_functions(model, identity, lift_scalars=True)
                identity = {merged.get(fid, fid): group for fid, group in identity.items()
                            if merged.get(fid, fid) in model.functions}
            optimize(model, identity.keys(), fold_weights=options.fold_weights)
        variants = Variants(model.functions)
        again = merge_functions(model, identity, lift_scalars=lift, variants=variants)
        merged = {fid: again.get(new, new) for fid, new in merged.items()} | {
            fid: new for fid, new in again.items() if fid not in merged}
        functions = tuple(dict.fromkeys(merged.get(fid, fid) for fid in outlined.functions))
        fix_opsets(model, [model.functions[fid] for fid in functions], exported_opsets)
        _initializers_in_first_use_order(model.graph)
        if not options.body_node_names:
            drop_node_names(model.functions[fid] for fid in functions)
    by_group = {k: merged.get(fid, fid) if fid is not None else None
                for k, fid in outlined.by_group.items()}
    return Outlined(by_group, functions, outlined.recomputed, outlined.ids,
                    variants.renamed(merged))


def _initializers_in_first_use_order(graph: ir.Graph) -> None:
    """Initializers in the order the main graph first reads them, as torch.onnx writes them:
    onnxruntime lays weights out in memory in this order (measured: ~1% of latency on GPT-2)."""
    first: dict[str, int] = {}
    for i, node in enumerate(graph):
        for value in node.inputs:
            if value is not None and value.name is not None:
                first.setdefault(value.name, i)
    inits = graph.initializers
    ordered = sorted(inits.items(), key=lambda item: first.get(item[0], len(first) + 1))
    if [name for name, _ in ordered] != list(inits):
        inits.clear()
        for name, value in ordered:
            inits[name] = value
