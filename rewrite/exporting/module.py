"""``rewrite.export`` of an ``nn.Module``: a grouped ONNX model out, in one call.

The drop-in for ``torch.onnx.export(model, args, dynamo=True)`` in scripts and exporters:
``torch.export.export`` (with ``preserve_node_meta``, so ``torch.fx.traceback.annotate`` tags
survive), then :func:`rewrite.apply` and the ONNX backend, then graph input/output names
(:func:`export_module`). A checkpoint folder's model comes here too, from
:mod:`rewrite.exporting.checkpoint`.
"""

from __future__ import annotations

import contextlib
import gc
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from attrs import frozen

from rewrite._private.exclusive import exclusive
from rewrite._private.torch_fake_cache import new_modes_uncached
from rewrite.api import apply, as_ruleset
from rewrite.compile import RuleSet, parse_rules
from rewrite.exporting.bounds import Bounded, bounds, record, within
from rewrite.exporting.deferred import Deferrable, deferrable, unproven
from rewrite.exporting.dim_names import dim_names, rename_dims
from rewrite.errors import library_call
from rewrite.errors import InputError, first_line
from rewrite.files.outputs import Beside

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx import OnnxOptions, Progress
    from rewrite.exporting.verify import Check

Tracing = Callable[[Callable[..., "torch.export.ExportedProgram"], tuple, Any],
                   "torch.export.ExportedProgram"]
"""A way of running ``torch.export``: given the call that exports (its keywords ``args`` and
``dynamic_shapes`` export other example inputs), its example inputs and dynamic shapes, the
program."""


@frozen(eq=False)
class Variant:
    """One more model of the module, from other example inputs of the same structure (a
    static size: ``--static seq=128,seq=1``), written beside the output and reading its
    data file (:mod:`rewrite.backends.onnx.shared_data`)."""

    args: tuple
    output: Path
    check: "Check | None" = None


def export_module(model: "torch.nn.Module", args: tuple, kwargs: Mapping[str, Any] | None,
                  *, rules: RuleSet | str | Path | None, dynamic_shapes: Any, strict: bool,
                  output: str | Path | None, input_names: Sequence[str] | None,
                  output_names: Sequence[str] | None, progress: "Progress",
                  options: "OnnxOptions", inputs: Sequence[str | Path] = (),
                  axis_names: Any = None, check: "Check | None" = None,
                  beside: "Callable[[ir.Model], Beside] | None" = None,
                  finish: "Callable[[ir.Model], None] | None" = None,
                  variants: Sequence[Variant] = (), trace: "Tracing | None" = None
                  ) -> "ir.Model":
    """:func:`rewrite.export` of an ``nn.Module``; ``output`` must not be one of ``inputs``. The
    model's symbolic dimensions take the names of the ``Dim``\\ s of ``dynamic_shapes``, or
    of ``axis_names`` (the same form, with names) when given. ``check``: what onnxruntime
    must reproduce before the output is published (:mod:`rewrite.exporting.verify`).
    ``beside``: given the finished model, the files to publish with it beside ``output`` (a
    checkpoint's ``genai_config.json`` and tokenizer files). ``finish``: done to the lowered
    model before it is written (int4 weights); its weights are then not written early.
    ``variants``: further models exported the same way and published with the output
    (each a ``torch.export`` of its own; the weights written once). ``trace``: runs each
    ``torch.export`` call it is given its own way (a checkpoint's layers traced once:
    :func:`rewrite.exporting.once.traced_once`)."""
    from rewrite.backends.onnx.save import weights_early, write_model
    from rewrite.backends.onnx.shared_data import Sibling
    from rewrite.files.outputs import check_output_path

    ruleset = as_ruleset(rules) if rules is not None else None
    out = check_output_path(output, inputs) if output is not None else None
    for variant in variants:
        check_output_path(variant.output, inputs)
    early = contextlib.nullcontext() if out is None or finish is not None else weights_early(
        model, out, threshold=options.external_data_threshold, chunk=options.weights_chunk)
    names = axis_names if axis_names is not None else dynamic_shapes

    def made(example: tuple, rules: RuleSet | None) -> "tuple[RuleSet, ir.Model]":
        program, used, onnx_model = _lowered(model, example, kwargs, rules, dynamic_shapes,
                                             strict, options, progress, trace)
        rename_dims(onnx_model, dim_names(program, names))
        rename_values(onnx_model, input_names, output_names)
        if finish is not None:
            finish(onnx_model)
        return used, onnx_model

    with early as data:  # the weights in files are written while the graph is made
        ruleset, onnx_model = made(args, ruleset)
        siblings = []
        for variant in variants:  # the last model's program and lowering, held in cycles
            gc.collect()  # (FX graphs), freed first: the next reuses their memory
            siblings.append(Sibling(made(variant.args, ruleset)[1], Path(variant.output),
                                    variant.check))
        if out is not None:
            files = beside(onnx_model) if beside is not None else Beside()
            with progress.step(f"writing {out}"):
                write_model(onnx_model, out, threshold=options.external_data_threshold,
                            chunk=options.weights_chunk, progress=progress, early=data,
                            check=check, beside=files, siblings=siblings)
    return onnx_model


def _lowered(model: "torch.nn.Module", args: tuple, kwargs: Mapping[str, Any] | None,
             ruleset: RuleSet | None, dynamic_shapes: Any, strict: bool,
             options: "OnnxOptions", progress: "Progress", trace: "Tracing | None" = None
             ) -> tuple["torch.export.ExportedProgram", RuleSet, "ir.Model"]:
    """``model`` exported by ``torch.export`` (through ``trace`` when given), grouped and
    lowered: (program, the rules used, ONNX model)."""
    from rewrite.backends.onnx import lower

    proved: list[str] = []

    def traced(limits: Mapping[str, int] | None) -> "torch.export.ExportedProgram":
        export = partial(_torch_export, model, args=args, kwargs=kwargs,
                         dynamic_shapes=dynamic_shapes, strict=strict, limits=limits,
                         proved=proved)
        return trace(export, args, dynamic_shapes) if trace is not None else export()

    limits: dict[str, int] = {}
    with progress.step(f"exporting {type(model).__name__} with torch.export"), exclusive(), \
            new_modes_uncached():
        while True:
            try:
                program = traced(limits or None)
                break
            except Bounded as bounded:  # each time lower (a size's last value refused)
                if limits and not all(bounded.limits.get(k, v) < v for k, v in limits.items()
                                      if k in bounded.limits):
                    raise
                progress.note(bounded.says)
                limits = {**limits, **bounded.limits}
    for line in dict.fromkeys(proved):
        progress.note(line)
    if ruleset is None:
        ruleset = suggested_rules(program, type(model).__name__, progress)
    lowering = lower(apply(ruleset, program), options, progress)
    record(lowering.model, limits)
    for warning in lowering.warnings:
        progress.note(warning.render())
    return program, ruleset, lowering.model


def _torch_export(model: "torch.nn.Module", args: tuple, kwargs: Mapping[str, Any] | None,
                  dynamic_shapes: Any, strict: bool, limits: Mapping[str, int] | None = None,
                  proved: list[str] | None = None) -> "torch.export.ExportedProgram":
    """``torch.export.export`` keeping node metadata, its dynamic sizes bounded by ``limits``
    (:mod:`rewrite.exporting.bounds`). What it rejects in the model is an
    :class:`InputError` (a :class:`~rewrite.exporting.bounds.Bounded` where the model holds
    for bounded sizes and ``limits`` is None); a failure in rewrite's own code that it traces
    (a checkpoint's decode-ready forward) is rewrite's bug, a crash of torch's own a
    ``LibraryError`` (:func:`~rewrite.errors.library_call`). Where it rejects conditions on a
    size that it cannot prove, the model is exported again with them deferred to run time,
    and that program stands only where they hold for every size it accepts
    (:mod:`rewrite.exporting.deferred`); ``proved`` then gets a line saying so. Where they
    hold up to some length only, a :class:`~rewrite.exporting.bounds.Bounded` at it."""
    import torch

    name = type(model).__name__

    def rejected(e: BaseException) -> InputError:
        found = bounds(str(e)) if limits is None and dynamic_shapes is not None else {}
        if found:
            return Bounded(name, found)
        guard = violated(str(e)) or data_dependent(str(e))
        if guard:
            kind = Deferrable if deferrable(str(e)) else InputError
            return kind(f"torch.export could not export {name}: {guard}")
        first = first_line(e) or type(e).__name__
        return InputError(f"torch.export could not export {name}: {type(e).__name__}: {first}")

    shapes = within(dynamic_shapes, limits) if limits else dynamic_shapes

    def export(deferred: bool) -> "torch.export.ExportedProgram":
        with library_call("torch.export", f"exporting {name}", rejected), \
                torch.fx.traceback.preserve_node_meta():
            return torch.export.export(model, tuple(args), kwargs=dict(kwargs or {}),
                                       dynamic_shapes=shapes, strict=strict,
                                       prefer_deferred_runtime_asserts_over_guards=deferred)

    try:
        return export(False)
    except Deferrable as refusal:
        try:
            program = export(True)
        except InputError:  # a guard torch.export keeps (ProphetNet's count of chunks)
            raise InputError(f"{refusal}, nor defer to run time (torch.export keeps it as a "
                             "guard: a limit of torch.export)") from None
        failed = unproven(program, dim_names(program, dynamic_shapes))
        if failed is not None and failed.bounds:  # true up to some length: exported up to it
            raise Bounded(name, {**(limits or {}), **failed.bounds},
                          f"{failed.why}, true below") from None
        if failed is not None:
            raise InputError(f"{refusal}; {failed.why}") from None
        if proved is not None:
            proved.append(f"torch.export: {str(refusal).partition(': ')[2]}; deferred to run "
                          "time and proved by rewrite for every length it accepts")
        return program


def violated(message: str) -> str:
    """What torch.export's "Constraints violated" ``message`` says in one line: the dynamic
    size the model's code holds for some values only, and the condition it needs; empty for
    another message."""
    import re

    found = re.search(r"Not all values of (\w+) = (\S+) in the specified range(?: .+?)? "
                      r"satisfy the generated guard (.+?)\.?(?:Specializations unexpectedly "
                      r"required.*)?$", message, re.M)
    constant = re.search(r"You marked (\w+) as dynamic but your code specialized it to be a "
                         r"constant \((\d+)\)", message)
    if found is None and constant is not None:
        dim, size = constant.groups()
        return (f"the model's code makes the dynamic {dim} a constant ({size}, the example's): "
                "a Python number made from the size (a list or range of its length), which "
                "holds for that length only; tensor ops on the size in the model's code would "
                "help")
    if found is None:
        return ""
    dim, size, guard = found.groups()
    guard = guard.replace(size, dim)
    if len(guard) > 160:
        guard = guard[:157] + "..."
    return (f"the model's code holds for some values of the dynamic {dim} only ({guard}): a "
            "shape condition torch.export cannot prove for every length")


def data_dependent(message: str) -> str:
    """What torch.export's "Could not guard on data-dependent expression" ``message`` says in
    one line: the model's code branching on a value computed from the data, where; empty for
    another message."""
    import re

    found = re.search(r"Could not guard on data-dependent expression (.+?) \(unhinted", message)
    if found is None:
        return ""
    where = re.search(r"The following call raised this error:\s+File \"(?:.*/)?([^/\"]+)\", "
                      r"line (\d+), in (\w+)", message)
    at = f", {where.group(1)}:{where.group(2)} in {where.group(3)}" if where else ""
    return (f"the model's code branches on a value computed from the input data "
            f"({found.group(1)}{at}), which torch.export cannot trace for every input: "
            "torch.cond or torch._check in the model's code would help")


CYCLE_POLICY = """
# rewrite export: a group that cannot be outlined (data leaves it and comes back) is flattened
# into its parent with a warning, as in the shipped rules: never a stop on an exported model.
on cycle flatten
"""


def suggested_rules(program: "torch.export.ExportedProgram", name: str,
                    progress: "Progress") -> RuleSet:
    """What ``rewrite suggest`` writes for ``program`` with :data:`CYCLE_POLICY`, compiled;
    its text goes to ``progress.note`` so that the user can keep it."""
    from rewrite.suggest import render, suggest

    text = render(suggest(program, name)) + CYCLE_POLICY
    progress.note(text.rstrip("\n"))
    return parse_rules(text, f"<rules suggested for {name}>")


def rename_values(model: "ir.Model", input_names: Sequence[str] | None,
                  output_names: Sequence[str] | None) -> None:
    """Give the graph's first inputs and outputs the given names, in place.

    Call nodes of functions refer to the values themselves, so renaming a value that a
    function call produces renames it at the call too. An output that cannot carry its own
    name (it is also a graph input, an initializer, or another output) gets an ``Identity``
    of that name. A name another value of the graph already has moves that value aside
    (``name_1``)."""
    graph = model.graph
    for kind, names, values in (("input", input_names, graph.inputs),
                                ("output", output_names, graph.outputs)):
        if names is None:
            continue
        names = list(names)
        if len(names) > len(values):
            raise InputError(f"{len(names)} {kind}_names given, but the graph has "
                             f"{len(values)} {kind}s")
        if len(set(names)) != len(names):
            raise InputError(f"{kind}_names has a name twice: {names}")
    both = set(input_names or ()) & set(output_names or ())
    if both:
        raise InputError(f"names given to both an input and an output: {sorted(both)}")
    wanted = {*(input_names or ()), *(output_names or ())}
    taken = _value_names(graph)
    for value, name in zip(list(graph.inputs), input_names or ()):
        _rename(value, name, taken, wanted)
    for k, name in enumerate(output_names or ()):
        value = graph.outputs[k]
        if _shared(graph, value, k):
            value = _identity(graph, value, k)
        _rename(value, name, taken, wanted)


def _value_names(graph: "ir.Graph") -> dict[str, "ir.Value"]:
    names = {v.name: v for v in graph.inputs if v.name}
    names.update({n: v for n, v in graph.initializers.items()})
    for node in graph:
        names.update({v.name: v for v in node.outputs if v.name})
    return names


def _shared(graph: "ir.Graph", value: "ir.Value", k: int) -> bool:
    """Whether output ``k`` is a value that must keep another role's name."""
    others = [v for i, v in enumerate(graph.outputs) if i != k]
    return (value.is_graph_input() or value.is_initializer()
            or any(v is value for v in others))


def _identity(graph: "ir.Graph", value: "ir.Value", k: int) -> "ir.Value":
    """A fresh value equal to ``value`` (an ``Identity`` node), as graph output ``k``."""
    import onnx_ir as ir

    node = ir.node("Identity", [value])
    graph.append(node)
    copy = node.outputs[0]
    copy.type, copy.shape = value.type, value.shape
    graph.outputs[k] = copy
    return copy


def _rename(value: "ir.Value", name: str, taken: dict, wanted: set) -> None:
    if value.name == name:
        return
    other = taken.get(name)
    if other is not None and other is not value:
        free = next(f"{name}_{i}" for i in range(1, len(taken) + 2)
                    if f"{name}_{i}" not in taken and f"{name}_{i}" not in wanted)
        _move(other, free, taken)
    _move(value, name, taken)


def _move(value: "ir.Value", name: str, taken: dict) -> None:
    """Rename ``value`` (onnx_ir renames an initializer's entry too)."""
    taken.pop(value.name, None)
    value.name = name
    taken[name] = value
