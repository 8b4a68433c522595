"""The finishing steps as onnx_ir passes (``InPlacePass``), run in one ``Sequential``.

Each pass changes the model in place and states, in ``ensures``, the invariant it leaves
(onnx_ir checks it after the pass and raises ``PostconditionError`` naming the pass):

* :class:`MergeScalarVariants`: bodies of one identity equal up to scalars share one function
  (before optimizing: a function attribute is not folded away); no node calls a function
  merging removed;
* :class:`OptimizeBodies`: onnxscript's optimizer once per distinct body and over the main
  graph; no function body holds an initializer;
* :class:`FuseAttention`: each body's attention as one opset-23 ``Attention``, its rotary
  embeddings as ``RotaryEmbedding`` (``OnnxOptions.fuse_attention``); every graph imports the
  default domain at 23 where one fused;
* :class:`PackProjections`: the projections of one input (q / k / v, gate / up) as one
  ``MatMul`` by their weights packed, then a ``Split`` (``OnnxOptions.pack_projections``);
* :class:`MergeEqualFunctions`: no two functions of one identity have equal body keys;
* :class:`FixOpsets`: every domain a graph uses is imported, by the model and by each
  function made;
* :class:`InitializersInFirstUseOrder`, :class:`DropBodyNodeNames`;
* :class:`PortableStackTraces`: no node's stack trace names a file under an import root by
  its absolute path.

What the passes learn (functions merged, variants kept apart) is kept in a :class:`Finishing`
they share, which :func:`finishing.finish` reads afterwards.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import onnx_ir as ir
from attrs import define, field

from rewrite._shared.onnx_ir_nodes import model_nodes
from rewrite.backends.onnx._opsets import fix_opsets, used_domains
from rewrite.backends.onnx.distinct import Variants
from rewrite.backends.onnx.finishing._attention import OPSET, flatten_heads, fuse_attention
from rewrite.backends.onnx.finishing._contrib import DOMAIN, group_query_attention, skip_norms
from rewrite.backends.onnx.finishing._merge import merge_functions, merge_keys
from rewrite.backends.onnx.finishing._optimize import optimize
from rewrite.backends.onnx.finishing._pack import pack_projections
from rewrite.backends.onnx.finishing._portable import import_roots, make_portable, stack_traces
from rewrite.backends.onnx.finishing._rotary import call_sites, fuse_rotary
from rewrite.backends.onnx.outlining import drop_node_names
from rewrite.backends.onnx.summary import FunctionId
from rewrite.errors import RewriteError


@define
class Finishing:
    """What the finishing passes share: the identity of each function outlining made, the
    functions merged so far (old id -> the id that now stands for it), the variants."""

    identity: dict[FunctionId, tuple[str, str]]
    """Function (made by outlining, as merging renamed it) -> its group's domain and base
    name."""
    made: tuple[FunctionId, ...]
    """The functions outlining made, in order."""
    merged: dict[FunctionId, FunctionId] = field(factory=dict)
    variants: Variants | None = None
    fused: dict[FunctionId, int] = field(factory=dict)
    """Function -> the attention and rotary subgraphs :class:`FuseAttention` fused in its
    body."""

    def merge(self, found: Mapping[FunctionId, FunctionId]) -> None:
        """``found`` (a merge's result) composed with the merges before it."""
        self.merged = {fid: found.get(new, new) for fid, new in self.merged.items()} | {
            fid: new for fid, new in found.items() if fid not in self.merged}

    @property
    def functions(self) -> tuple[FunctionId, ...]:
        """The functions made, merged ones replaced, each once, in order."""
        return tuple(dict.fromkeys(self.merged.get(fid, fid) for fid in self.made))


class _Pass(ir.passes.InPlacePass):
    def __init__(self, state: Finishing) -> None:
        super().__init__()
        self.state = state


class MergeScalarVariants(_Pass):
    """Bodies of one identity equal up to scalars: one function reading attributes."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        state = self.state
        merged = merge_functions(model, state.identity, lift_scalars=True)
        state.merge(merged)
        state.identity = {merged.get(fid, fid): group for fid, group in state.identity.items()
                          if merged.get(fid, fid) in model.functions}
        return ir.passes.PassResult(model, bool(merged))

    def ensures(self, model: ir.Model) -> None:
        _calls_retargeted(model, self.state.merged)


class OptimizeBodies(_Pass):
    """onnxscript's optimizer once per body outlining made, and over the main graph (without
    ``fold_weights``, no weight transposed into a copy: see :func:`optimize`)."""

    def __init__(self, state: Finishing, fold_weights: bool = True) -> None:
        super().__init__(state)
        self.fold_weights = fold_weights

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        optimize(model, self.state.identity.keys(), fold_weights=self.fold_weights)
        return ir.passes.PassResult(model, True)

    def ensures(self, model: ir.Model) -> None:
        held = [f"{fid[0]}::{fid[1]}" for fid, f in model.functions.items()
                if f.graph.initializers]
        if held:
            raise ir.passes.PostconditionError(f"function bodies hold initializers: {held}")


class FuseAttention(_Pass):
    """:func:`_attention.fuse_attention` and :func:`_rotary.fuse_rotary` once per body
    outlining made; where any fused, the model and every function import the default domain
    at the opset of ``Attention`` and ``RotaryEmbedding``. onnxruntime's ops named in
    ``contrib`` too (:mod:`_contrib`), imported where used."""

    def __init__(self, state: Finishing, contrib: tuple[str, ...] = ()) -> None:
        super().__init__(state)
        self.contrib = contrib

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sites = call_sites(model)
        fused = {fid: fuse_attention(model.functions[fid].graph)
                 + fuse_rotary(model, fid, sites) for fid in self.state.identity}
        for fid in fused:
            flatten_heads(model.functions[fid].graph)
            if "GroupQueryAttention" in self.contrib:
                fused[fid] += group_query_attention(model.functions[fid].graph)
            if "SkipSimplifiedLayerNormalization" in self.contrib:
                fused[fid] += skip_norms(model, fid)
        self.state.fused = {fid: n for fid, n in fused.items() if n}
        if self.state.fused:
            for imports in [model.opset_imports, *(f.opset_imports
                                                   for f in model.functions.values())]:
                imports[""] = max(imports.get("", OPSET), OPSET)
            for fid in self.state.fused:
                if any(node.domain == DOMAIN for node in model.functions[fid]):
                    model.functions[fid].opset_imports.setdefault(DOMAIN, 1)
                    model.opset_imports.setdefault(DOMAIN, 1)
        return ir.passes.PassResult(model, bool(self.state.fused))

    def ensures(self, model: ir.Model) -> None:
        low = [fid for fid in self.state.fused
               if model.functions[fid].opset_imports.get("", 0) < OPSET]
        if low:
            raise ir.passes.PostconditionError(f"fused bodies below opset 23: {low}")


class PackProjections(_Pass):
    """:func:`_pack.pack_projections` once per body outlining made."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        packed = sum(pack_projections(model, fid) for fid in self.state.identity
                     if fid in model.functions)
        return ir.passes.PassResult(model, bool(packed))


class MergeEqualFunctions(_Pass):
    """Functions of one identity with equal bodies (scalars lifted, with ``lift_scalars``)
    merged; each body kept apart told to the variants (why distinct)."""

    def __init__(self, state: Finishing, lift_scalars: bool) -> None:
        super().__init__(state)
        self.lift_scalars = lift_scalars

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        state = self.state
        state.variants = Variants(model.functions)
        merged = merge_functions(model, state.identity, lift_scalars=self.lift_scalars,
                                 variants=state.variants)
        state.merge(merged)
        return ir.passes.PassResult(model, bool(merged))

    def ensures(self, model: ir.Model) -> None:
        _calls_retargeted(model, self.state.merged)
        identity = {self.state.merged.get(f, f): g for f, g in self.state.identity.items()}
        keys = merge_keys(model, identity, lift_scalars=self.lift_scalars)
        counts = Counter(keys.values())
        equal = [fid for fid, key in keys.items() if counts[key] > 1]
        if equal:
            raise ir.passes.PostconditionError(f"functions with equal bodies left: {equal}")


class FixOpsets(_Pass):
    """The imports every graph needs (:func:`_opsets.fix_opsets`)."""

    def __init__(self, state: Finishing, known: Mapping[str, int]) -> None:
        super().__init__(state)
        self.known = dict(known)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        fix_opsets(model, [model.functions[fid] for fid in self.state.functions], self.known)
        return ir.passes.PassResult(model, True)

    def ensures(self, model: ir.Model) -> None:
        graphs = [("the model", model.graph, model.opset_imports)]
        graphs += [(f"{fid[0]}::{fid[1]}", model.functions[fid], model.functions[fid]
                    .opset_imports) for fid in self.state.functions]
        for what, graph, imports in graphs:
            missing = sorted(used_domains(graph) - imports.keys())
            if missing:
                raise ir.passes.PostconditionError(f"{what} does not import {missing}")


class InitializersInFirstUseOrder(ir.passes.InPlacePass):
    """Initializers in the order the main graph first reads them, as torch.onnx writes them:
    onnxruntime lays weights out in memory in this order (measured: ~1% of latency on
    GPT-2)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        first = _first_use(model.graph)
        inits = model.graph.initializers
        ordered = sorted(inits.items(), key=lambda item: first.get(item[0], len(first) + 1))
        changed = [name for name, _ in ordered] != list(inits)
        if changed:
            inits.clear()
            for name, value in ordered:
                inits[name] = value
        return ir.passes.PassResult(model, changed)

    def ensures(self, model: ir.Model) -> None:
        first = _first_use(model.graph)
        order = [first.get(name, len(first) + 1) for name in model.graph.initializers]
        if order != sorted(order):
            raise ir.passes.PostconditionError("initializers not in first-use order")


def _first_use(graph: ir.Graph) -> dict[str, int]:
    """Value name -> index of the first main-graph node that reads it."""
    first: dict[str, int] = {}
    for i, node in enumerate(graph):
        for value in node.inputs:
            if value is not None and value.name is not None:
                first.setdefault(value.name, i)
    return first


class PortableStackTraces(ir.passes.InPlacePass):
    """The source paths in the nodes' stack traces relative to their import root
    (:mod:`finishing._portable`): the same model from the same code wherever it lies."""

    def __init__(self) -> None:
        super().__init__()
        self.roots = import_roots()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, make_portable(model, self.roots))

    def ensures(self, model: ir.Model) -> None:
        for node, trace in stack_traces(model):
            if any(f'File "{root}' in trace for root in self.roots):
                raise ir.passes.PostconditionError(
                    f"{node.name}: its stack trace names an absolute source path")


class DropBodyNodeNames(_Pass):
    """Every node of the functions made unnamed (``OnnxOptions.body_node_names=False``)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        drop_node_names(model.functions[fid] for fid in self.state.functions)
        return ir.passes.PassResult(model, True)


def _calls_retargeted(model: ir.Model, merged: Mapping[FunctionId, FunctionId]) -> None:
    """No node calls a function merging removed (or renamed)."""
    gone = set(merged) - model.functions.keys()
    if not gone:
        return
    for node in model_nodes(model):
        if (node.domain, node.op_type, node.overload) in gone:
            raise ir.passes.PostconditionError(
                f"{node.name} calls {node.domain}::{node.op_type}, which merging removed")


def run_passes(model: ir.Model, passes: list[ir.passes.PassBase]) -> None:
    """``passes`` run in one ``Sequential``. onnx_ir wraps what a pass raises in a
    ``PassError`` naming the pass: rewrite's own errors (a dependency failing: see the error
    rule in docs/ARCHITECTURE.md) are raised as they are; anything else is a bug, raised with
    the pass named."""
    try:
        ir.passes.Sequential(*passes)(model)
    except ir.passes.PassError as e:
        if isinstance(e.__cause__, RewriteError):
            raise e.__cause__ from e.__cause__.__cause__
        raise
