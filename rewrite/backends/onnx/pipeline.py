"""From a :class:`Result` to an ``onnx_ir.Model`` with functions: the backend's pipeline.

* ``.pt2`` / ExportedProgram (with in-place ops: in torch's functional form,
  :func:`perbody.functional`, grouped again): torch.onnx lowers the ops (one
  decomposition, not optimized; per body, :mod:`perbody`, each repeated call but the first
  of its body left standing in for its nodes, :mod:`standins`), :mod:`remap` groups its
  nodes with the same rules, :mod:`outline` outlines, and :mod:`optimize` runs onnxscript's
  optimizer once per distinct function body and over the main graph
  (``OnnxOptions.optimize``). A stand-in that does not fit (:class:`standins.Materialize`,
  from planning or outlining) is inlined: translated, grouped and outlined again, the
  decomposition kept.
* ``.onnx`` / onnx_ir.Model: outlined with the tree ``apply`` made. A model the caller
  gave is copied first (:mod:`clone`; the input is never changed); one ``apply`` loaded from
  a path belongs to rewrite alone, so the first lowering outlines it as it is (no copy), and
  later lowerings of the same result read the file again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx_ir as ir
import torch
from attrs import frozen

from rewrite._gc import gc_paused
from rewrite._mapped import start_checks
from rewrite.backends.onnx.clone import copy_model
from rewrite.backends.onnx.distinct import Variants
from rewrite.backends.onnx.export import export_program, quiet_exporter
from rewrite.backends.onnx.merge import merge_functions
from rewrite.backends.onnx.naming import drop_node_names
from rewrite.backends.onnx.opsets import fix_opsets
from rewrite.backends.onnx.optimize import optimize
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outline import Outlined, outline
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.backends.onnx.perbody import (
    PerBody,
    PerBodyLowering,
    Unsupported,
    check,
    functional,
    in_place,
)
from rewrite.backends.onnx.standins import Materialize
from rewrite.backends.onnx.remap import regroup, regroup_with
from rewrite.errors import Diagnostic, InputError, first_line
from rewrite.frontends import load_graph
from rewrite.grouping import GroupTree, group_graph
from rewrite.ir import Graph

if TYPE_CHECKING:
    from rewrite.api import Result


@frozen
class Lowering:
    """The lowered model and how it was made."""

    model: ir.Model
    tree: GroupTree
    """The groups over the ONNX graph that was outlined (for a model the caller gave: over
    that model's graph, of which the outlined one is a copy)."""
    outlined: Outlined
    warnings: tuple[Diagnostic, ...] = ()
    path: str = "onnx"
    """How the ops were lowered: ``per-body``, ``flat`` (torch.onnx.export of the whole
    program) or ``onnx`` (the input was ONNX)."""
    inlined: int | None = None
    """``per-body``: how many grouped calls were inlined (the first of each body, and those
    that could not stand in, see ``standins``); the others were never materialized."""


_OUTLINED = "rewrite.outlined"
"""``Model.meta`` key: this model loaded from a path has been outlined in place."""


def _onnx_model(result: "Result") -> tuple[ir.Model, GroupTree]:
    """The ONNX model to outline in place, and its tree (see the module docstring)."""
    tree = result.tree
    if not isinstance(result.model, (str, Path)):
        # outlining reads the copy's main-graph nodes in order, as the tree's ONNX nodes
        with gc_paused():
            return copy_model(tree.graph.source), tree
    model: ir.Model = tree.graph.source
    if model.meta.get(_OUTLINED):  # read the file again and group it as ``apply`` did
        tree = group_graph(result.rules, load_graph(result.model))
        model = tree.graph.source
    model.meta[_OUTLINED] = True
    return model, tree


def lower(result: "Result", options: OnnxOptions | None = None,
          progress: Progress | None = None) -> Lowering:
    """Lower ``result`` (see the module docstring)."""
    options = options or OnnxOptions()
    progress = progress or SILENT
    tree = result.tree
    source = tree.graph.source
    warnings: list[Diagnostic] = []
    path = "onnx"
    lowered: PerBody | None = None
    lowering: PerBodyLowering | None = None
    if tree.graph.kind == "onnx":
        model, onnx_tree = _onnx_model(result)
    elif isinstance(source, torch.export.ExportedProgram):
        start_checks([*source.state_dict.values(), *source.constants.values()])
        model, onnx_tree, warnings, path, lowered, lowering = _lower_program(
            result, source, options, progress)
    else:
        raise InputError(
            "ONNX output needs an ExportedProgram, a .pt2 file or an ONNX model; export this "
            "GraphModule with torch.export.export first"
        )
    plan = lowered.plan if lowered is not None else None
    while True:
        total = sum(1 for _ in onnx_tree.groups())
        done = 0

        def on_group(group) -> None:
            nonlocal done
            done += 1
            progress.update(f"outlining groups: {done}/{total} ({group.id})")

        try:
            with progress.step(f"outlining {total} groups into ONNX functions"):
                outlined = outline(model, onnx_tree, options, on_group, plan)
            break
        except Materialize as e:  # again, with those calls inlined (see ``standins``)
            if lowering is None or lowered is None:
                raise
            lowered, onnx_tree, _ = _per_body(result, lowering, options,
                                              lowered.materialized | e.calls)
            model, plan = lowered.model, lowered.plan
    optimized = options.optimize and tree.graph.kind != "onnx"
    with progress.step(f"optimizing {len(outlined.functions)} functions and the main graph"
                       if optimized else "merging equal functions"):
        outlined = finish(model, onnx_tree, outlined, options, optimized)
    return Lowering(model, onnx_tree, outlined, tuple(warnings), path,
                    lowered.inlined if lowered is not None else None)


def _lower_program(result: "Result", program: torch.export.ExportedProgram,
                   options: OnnxOptions, progress: Progress):
    """ONNX ops for ``program`` grouped like ``result.tree``: per body (:mod:`perbody`), or
    with ``torch.onnx.export`` of the flat program (``options.lowering``)."""
    tree = result.tree
    warnings: list[Diagnostic] = []
    if options.lowering != "flat":
        try:
            if in_place(program):
                with progress.step("torch.export: functionalizing the program's in-place ops"):
                    program, tree = _functional(result, program)
            with progress.step("torch.onnx: decomposing and translating each distinct body once"):
                check(program)
                with quiet_exporter():
                    lowering = PerBodyLowering(program, tree, options.custom_translation_table)
                lowered, onnx_tree, more = _per_body(result, lowering, options, frozenset())
            return lowered.model, onnx_tree, more, "per-body", lowered, lowering
        except Unsupported as e:
            reason = str(e)
        except Exception as e:  # torch internals (private APIs) changed or failed
            text = first_line(e)
            reason = f"{type(e).__name__}: {text}" if text else type(e).__name__
        if options.lowering == "per-body":
            raise InputError(f"cannot lower this program per body: {reason}")
        warnings.append(Diagnostic(
            "warning", f"lowered the flat program with torch.onnx.export (slower): per-body "
            f"lowering is not possible: {reason}"))
    with progress.step(f"torch.onnx.export ({_count(tree.graph)} FX nodes)"):
        exported = export_program(
            program, optimize=False, custom_translation_table=options.custom_translation_table)
    onnx_tree, more = regroup(result.rules, tree, exported.model, exported.program)
    return exported.model, onnx_tree, warnings + more, "flat", None, None


def _functional(result: "Result", program: torch.export.ExportedProgram
                ) -> tuple[torch.export.ExportedProgram, GroupTree]:
    """``program`` without in-place ops (:func:`perbody.functional`), grouped with the same
    rules (its nodes are new; module stacks and tags are kept)."""
    with quiet_exporter():
        program = functional(program)
    return program, group_graph(result.rules, load_graph(program))


def _per_body(result: "Result", lowering: PerBodyLowering, options: OnnxOptions,
              materialize: frozenset[int]):
    """Translate (the calls in ``materialize`` inlined, the others standing in where they
    can: not under the ``input`` constant policy, whose hoisted constants they cannot
    copy), group, and plan the stand-ins; again with more calls inlined until they fit."""
    while True:
        try:
            with quiet_exporter():
                lowered = lowering.lower(materialize, stand_ins=options.constants != "input")
            onnx_tree, more = regroup_with(result.rules, result.tree, lowered.model,
                                           lowered.resolver, lowered.expansions)
            return lowered.planned(onnx_tree), onnx_tree, more
        except Materialize as e:
            materialize |= e.calls


def finish(model: ir.Model, tree: GroupTree, outlined: Outlined, options: OnnxOptions,
           optimized: bool) -> Outlined:
    """Optimize the outlined ``model`` if asked, then merge functions (:mod:`merge`) and
    unname their nodes if asked; ``outlined`` with merged functions replaced."""
    records = tree.records
    identity = {fid: (records[k].domain, records[k].function_name)  # type: ignore[union-attr]
                for k, fid in outlined.by_group.items() if fid is not None}
    exported_opsets = dict(model.opset_imports)
    with gc_paused():
        if optimized:
            optimize(model, identity.keys())
        variants = Variants(model.functions)
        merged = merge_functions(model, identity, lift_scalars=options.constants != "embed",
                                 variants=variants)
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


def _count(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if not n.is_io)
