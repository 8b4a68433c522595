"""From a :class:`~rewrite.grouping.Grouped` (a :class:`rewrite.Result`) to an
``onnx_ir.Model`` with functions: the backend's pipeline.

* ``.pt2`` / ExportedProgram: strategies tried in order (``OnnxOptions.lowering``), each
  returning a :class:`Lowered` or a :class:`NotHere` with its reason, like torch.onnx's
  capture strategies; only a :class:`NotHere` moves on to the next, and says why in a
  warning; any other error surfaces.

  1. per body (:func:`_per_body`; a program with in-place ops first in torch's functional
     form, :func:`lowering.functional`, grouped again): torch.onnx lowers the ops (one
     decomposition, not optimized), each distinct body translated once (:mod:`lowering._perbody`),
     each repeated call but the first of its body left standing in for its nodes
     (:mod:`_standins`); :mod:`lowering._regroup` groups its nodes with the same rules and
     :mod:`outlining` outlines. Translating, planning and outlining each return the calls
     that cannot stand in (a :class:`_standins.MustInline`) instead of a result: the one
     loop, :func:`_inlining_until_all_fit`, translates again with those inlined too (the
     decomposition kept) until none is found;
  2. the flat program (:func:`_flat`): ``torch.onnx.export``, grouped again, outlined.

  Then :func:`finishing.finish`: scalar variants merged into one function with attributes
  (:mod:`finishing._merge`), onnxscript's optimizer once per distinct function body and
  over the main graph (``OnnxOptions.optimize``, :mod:`finishing._optimize`), equal
  functions merged, the opset imports fixed (:mod:`_opsets`).
* ``.onnx`` / onnx_ir.Model: outlined with the tree ``apply`` made, on a copy
  (``Model.clone``: tensors shared): the model the result holds, given or loaded from a path,
  is never changed, so every lowering of a result starts from the same model.

A lowering runs holding :func:`rewrite._private.exclusive.exclusive` (torch's tracing and
rewrite's swaps of private functions keep process-wide state while they run); the files a
``.pt2``'s weights are views of (``Graph.mapped``) are handed on in :attr:`Lowered.mapped`,
for the writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

import onnx_ir as ir
import torch
from attrs import evolve, frozen

from rewrite._private.exclusive import exclusive
from rewrite._shared.gc import gc_paused
from rewrite.files.mapped import MappedFile, start_checks
from rewrite.backends.onnx._standins import MustInline, Plan
from rewrite.backends.onnx.finishing import finish
from rewrite.backends.onnx.lowering import (
    NOT_HERE,
    DecomposedProgram,
    check,
    export_program,
    functional,
    in_place,
    regroup,
    regroup_with,
)
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining import Outlined, outline
from rewrite.backends.onnx.progress import SILENT, Progress
from rewrite.errors import Diagnostic, InputError, first_line
from rewrite.frontends import load_graph
from rewrite.grouping import GroupTree, group_graph
from rewrite.ir import Graph

if TYPE_CHECKING:
    from rewrite.grouping import Grouped


@frozen
class Lowered:
    """The lowered model and how it was made: what :func:`lower` returns (the stage that
    makes ONNX ops is :mod:`lowering`)."""

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
    """``per-body``: the number of grouped calls inlined (the first of each body, and those
    that could not stand in, see ``_standins``); the others were never materialized."""
    mapped: tuple[MappedFile, ...] = ()
    """The files the model's weights are views of, as the frontend mapped them (a ``.pt2``:
    :attr:`rewrite.ir.Graph.mapped`): the writer copies those weights from them."""


Lowering = Lowered
"""The former name of :class:`Lowered` (code outside the backend imports it)."""

def _onnx_copy(result: "Grouped") -> ir.Model:
    """A copy of the result's ONNX model to outline in place (see the module docstring)."""
    # outlining reads the copy's main-graph nodes in order, as the tree's ONNX nodes; the
    # copy shares the tensors (most of its cost was the garbage collector)
    with gc_paused():
        return result.tree.graph.source.clone()


def lower(result: "Grouped", options: OnnxOptions | None = None,
          progress: Progress | None = None) -> Lowered:
    """Lower ``result`` (see the module docstring); ``result`` is left as it was."""
    options = options or OnnxOptions()
    progress = progress or SILENT
    tree = result.tree
    source = tree.graph.source
    if tree.graph.kind == "onnx":
        with exclusive():
            return outline_in_place(_onnx_copy(result), tree, options, progress)
    if not isinstance(source, torch.export.ExportedProgram):
        raise InputError(
            "ONNX output needs an ExportedProgram, a .pt2 file or an ONNX model; export this "
            "GraphModule with torch.export.export first"
        )
    if options.check_weights:
        start_checks(tree.graph.mapped)  # see files.mapped
    with exclusive():
        lowered = _lower_program(result, source, options, progress)
        return evolve(_finished(lowered, options, progress, options.optimize),
                      mapped=tree.graph.mapped)


def outline_in_place(model: ir.Model, tree: GroupTree, options: OnnxOptions,
                     progress: Progress = SILENT) -> Lowered:
    """An ONNX model (``.onnx`` input, :class:`rewrite.RewritePass`) outlined in place with
    ``tree`` (grouped over its main graph) and finished, not optimized."""
    outlined = _outline(model, tree, options, progress)
    return _finished(Lowered(model, tree, outlined), options, progress, False)


def _finished(lowering: Lowered, options: OnnxOptions, progress: Progress, optimized: bool
              ) -> Lowered:
    """``lowering`` finished (:func:`finishing.finish`)."""
    with progress.step(f"optimizing {len(lowering.outlined.functions)} functions and the main "
                       "graph" if optimized else "merging equal functions"):
        outlined = finish(lowering.model, lowering.tree, lowering.outlined, options, optimized)
    return evolve(lowering, outlined=outlined)


@overload
def _outline(model: ir.Model, tree: GroupTree, options: OnnxOptions, progress: Progress,
             plan: None = None) -> Outlined: ...
@overload
def _outline(model: ir.Model, tree: GroupTree, options: OnnxOptions, progress: Progress,
             plan: Plan) -> Outlined | MustInline: ...
def _outline(model: ir.Model, tree: GroupTree, options: OnnxOptions, progress: Progress,
             plan: Plan | None = None) -> Outlined | MustInline:
    """:func:`outlining.outline`, its progress reported (a :class:`MustInline` only with a
    ``plan``: without one, every call is outlined where it is)."""
    total = sum(1 for _ in tree.groups())
    done = 0

    def on_group(group) -> None:
        nonlocal done
        done += 1
        progress.update(f"outlining groups: {done}/{total} ({group.id})")

    with progress.step(f"outlining {total} groups into ONNX functions"):
        return outline(model, tree, options, on_group, plan)


@frozen
class NotHere:
    """A strategy that does not apply to this program: why, and what the next strategy
    lowers (the program as this one left it: in its functional form, maybe)."""

    error: Exception | None
    """What the strategy raised (one of :data:`lowering.NOT_HERE`); None before the first."""
    program: torch.export.ExportedProgram
    tree: GroupTree
    """``program``'s groups."""

    @property
    def reason(self) -> str:
        """The first line of :attr:`error`."""
        return first_line(self.error) if self.error is not None else ""


def _lower_program(result: "Grouped", program: torch.export.ExportedProgram,
                   options: OnnxOptions, progress: Progress) -> Lowered:
    """ONNX ops for ``program`` grouped like ``result.tree``, outlined: the strategies of
    ``options.lowering`` tried in order (per body, :func:`_per_body`; the flat program,
    :func:`_flat`), like torch.onnx's capture strategies. Only a :class:`NotHere` moves on to
    the next (and says why in a warning); any other error surfaces."""
    strategies = {"auto": (_per_body, _flat), "per-body": (_per_body,), "flat": (_flat,)}
    found: Lowered | NotHere = NotHere(None, program, result.tree)
    warnings: tuple[Diagnostic, ...] = ()
    for strategy in strategies[options.lowering]:
        found = strategy(result, found.program, found.tree, options, progress)
        if isinstance(found, Lowered):
            return evolve(found, warnings=(*warnings, *found.warnings))
        if options.lowering == "per-body":
            raise InputError(f"cannot lower this program per body: {found.reason}"
                             ) from found.error
        warnings = (Diagnostic(
            "warning", f"lowered the flat program with torch.onnx.export (slower): per-body "
            f"lowering is not possible: {found.reason}", cause=found.error),)
    raise AssertionError("the flat strategy applies to every program")


def _flat(result: "Grouped", program: torch.export.ExportedProgram, tree: GroupTree,
          options: OnnxOptions, progress: Progress) -> Lowered:
    """``torch.onnx.export`` of the flat program, grouped again (:mod:`lowering._regroup`),
    outlined."""
    with progress.step(f"torch.onnx.export ({_count(tree.graph)} FX nodes)"):
        exported = export_program(
            program, optimize=False, custom_translation_table=options.custom_translation_table)
    onnx_tree, warnings = regroup(result.rules, tree, exported.model, exported.program)
    outlined = _outline(exported.model, onnx_tree, options, progress)
    return Lowered(exported.model, onnx_tree, outlined, tuple(warnings), "flat")


def _per_body(result: "Grouped", program: torch.export.ExportedProgram, tree: GroupTree,
              options: OnnxOptions, progress: Progress) -> Lowered | NotHere:
    """Each distinct body decomposed and translated once (:mod:`lowering._perbody`; a program with
    in-place ops first in its functional form, grouped again), or why not."""
    try:
        if in_place(program):
            check(program, in_place_ok=True)
            with progress.step("torch.export: functionalizing the program's in-place ops"):
                program, tree = _functional(result, program)
        with progress.step("torch.onnx: decomposing each distinct body once"):
            check(program)
            decomposed = DecomposedProgram(program, tree, options.custom_translation_table)
        return _inlining_until_all_fit(result, decomposed, options, progress)
    except NOT_HERE as e:
        return NotHere(e, program, tree)


def _inlining_until_all_fit(result: "Grouped", decomposed: DecomposedProgram,
                            options: OnnxOptions, progress: Progress) -> Lowered:
    """The one loop of the per-body path: translate with the first call of each body and the
    calls in ``must_inline`` inlined, the others standing in where they can (not under the
    ``input`` constant policy, whose hoisted constants they cannot copy), group, plan the
    stand-ins, outline; each step may find calls that cannot stand in (a
    :class:`MustInline`): again with those inlined too, until none is found."""
    must_inline: frozenset[int] = frozenset()
    while True:
        found = _translate_and_outline(result, decomposed, options, progress, must_inline)
        if isinstance(found, Lowered):
            return found
        grown = must_inline | found.calls
        if grown == must_inline:  # a bug: the same round again would not end
            raise RuntimeError(f"calls to inline found again: {sorted(found.calls)}")
        must_inline = grown


def _translate_and_outline(result: "Grouped", decomposed: DecomposedProgram,
                           options: OnnxOptions,
                           progress: Progress, must_inline: frozenset[int]
                           ) -> Lowered | MustInline:
    """One round of :func:`_inlining_until_all_fit`."""
    again = f", {len(must_inline)} more calls inlined" if must_inline else ""
    with progress.step(f"torch.onnx: translating each distinct body once{again}"):
        lowered = decomposed.translate(must_inline, stand_ins=options.constants != "input")
    if isinstance(lowered, MustInline):
        return lowered
    onnx_tree, warnings = regroup_with(result.rules, result.tree, lowered.model,
                                       lowered.resolver, lowered.expansions)
    planned = lowered.planned(onnx_tree)
    if isinstance(planned, MustInline):
        return planned
    outlined = _outline(planned.model, onnx_tree, options, progress, planned.plan)
    if isinstance(outlined, MustInline):
        return outlined
    return Lowered(planned.model, onnx_tree, outlined, tuple(warnings), "per-body",
                    planned.inlined)


def _functional(result: "Grouped", program: torch.export.ExportedProgram
                ) -> tuple[torch.export.ExportedProgram, GroupTree]:
    """``program`` without in-place ops (:func:`lowering.functional`), grouped with the same
    rules (its nodes are new; module stacks and tags are kept)."""
    program = functional(program)
    return program, group_graph(result.rules, load_graph(program))


def _count(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if not n.is_io)
