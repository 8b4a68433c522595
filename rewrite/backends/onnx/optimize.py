"""Optimize an outlined model: every distinct function body once, and the main graph.

torch.onnx's optimizer on the flat export works through every block, although outlining then
keeps one of them. Here the export is not optimized; after outlining, onnxscript's optimizer
(``optimize_ir(..., inline=False)``: constant and shape folding, its rewrite rules, unused
nodes, constants lifted to initializers, initializer dedup, CSE, name fixes) runs once over the
main graph and once over each function. Values inside a body keep the shapes and types of the
export (outlining moves the nodes and their values, and a function input copies the type and
shape of the value it stands for), so shape-dependent folding still fires inside bodies. A body
is only shared by calls whose inputs have equal types and shapes (they are part of its
structural key, see ``structure``), so folding for one call's shapes holds for all its calls.

onnxscript's CSE only visits the main graph: the same onnx_ir pass runs on each body here, then
identity elimination (a function output produced by an ``Identity``). Folding can make bodies
that differed equal (a constant that became the same); they are merged afterwards, innermost
first, and their calls retargeted, so there is still one function per distinct body.

Differences from optimizing the flat graph (where whole blocks are visible): weights are
function inputs, so nothing folds on weight *values* (the flat optimizer drops a Gemm bias
that happens to be all zeros, as in randomly initialized models); work that the flat
optimizer shares between blocks (e.g. a causal mask's ``Where``) is computed per call, which
onnxruntime's own CSE merges again after inlining; and rewrite rules that add initializers
(onnxscript's ``ReshapeReshape``) do not apply inside functions.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.optimizer import optimize_ir

from rewrite.backends.onnx.opsets import fix_opsets
from rewrite.backends.onnx.structure import Key, Keyer

Identifier = tuple[str, str, str]


def optimize(model: ir.Model, identity: dict[Identifier, tuple[str, str]]) -> dict[
        Identifier, Identifier]:
    """Optimize ``model`` in place (see the module docstring).

    ``identity`` maps each function made by outlining to its group identity (domain and base
    name): only functions of one identity are merged. Returns, for each merged function, the
    function that replaced it."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        optimize_ir(model, inline=False)
        for function in model.functions.values():
            _cse(model, function)
        common_passes.IdentityEliminationPass()(model)
        common_passes.RemoveUnusedNodesPass()(model)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    merged = merge_equal_functions(model, identity)
    fix_opsets(model, model.functions.values())
    return merged


def _cse(model: ir.Model, function: ir.Function) -> None:
    """onnx_ir's CSE on one function body (the pass itself only visits ``model.graph``)."""
    body = ir.Model(function.graph, ir_version=model.ir_version)
    common_passes.CommonSubexpressionEliminationPass()(body)


def merge_equal_functions(model: ir.Model, identity: dict[Identifier, tuple[str, str]]) -> dict[
        Identifier, Identifier]:
    """Merge functions of one group identity whose bodies became structurally equal.

    Functions are visited in ``model.functions`` order, in which a function comes after the
    functions it calls (outlining makes them bottom-up), so merging inner functions first
    lets their callers become equal too."""
    keyer = Keyer()
    first: dict[Key, Identifier] = {}
    merged: dict[Identifier, Identifier] = {}
    for fid, function in list(model.functions.items()):
        group = identity.get(fid)
        if group is None:  # a function the input model had
            continue
        _retarget(function, merged)
        key = _body_key(keyer, group, function)
        kept = first.setdefault(key, fid)
        if kept != fid:
            merged[fid] = kept
    if merged:
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            _retarget_node(node, merged)
        for fid in merged:
            del model.functions[fid]
    return merged


def _body_key(keyer: Keyer, identity: tuple[str, str], function: ir.Function) -> Key:
    nodes = list(function)
    position = {node: (i,) for i, node in enumerate(nodes)}
    ordered = keyer.canonical_order(nodes, position, lambda value: None)
    return keyer.body(identity, ordered, list(function.inputs), {}, list(function.outputs))


def _retarget(function: ir.Function, merged: dict[Identifier, Identifier]) -> None:
    if merged:
        for node in ir.traversal.RecursiveGraphIterator(function.graph):
            _retarget_node(node, merged)


def _retarget_node(node: ir.Node, merged: dict[Identifier, Identifier]) -> None:
    target = merged.get((node.domain, node.op_type, node.overload))
    if target is not None:
        node.domain, node.op_type, node.overload = target
