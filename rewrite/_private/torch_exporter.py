"""The private torch APIs of the per-body lowering (``backends/onnx/lowering/_perbody.py``).

Checked with the versions of :data:`rewrite._private.CHECKED_WITH`. torch.onnx.export(program) runs,
in ``torch.onnx._internal.exporter._core``: ``_prepare_exported_program_for_export``
(``run_decompositions`` with the ONNX decomposition table, an AOT-autograd re-trace of the
whole program, then explicit type promotion and the removal of assertion nodes) and
``_exported_program_to_onnx_program`` (the op-by-op translation, one ONNX function per
submodule of the graph module: ``invoke_subgraph`` bodies become local functions). The
per-body lowering does the same two steps, except that the decomposition is a ``make_fx``
re-trace (no AOT export, no functionalization) under the same decomposition table, the same
preserved CompositeImplicitAutograd ops and a ``TracingContext``, whose invoke_subgraph cache
traces each subgraph identifier once. Shortcuts keep the cost of each further call low, the
result the same (``tests/test_onnx_decompose.py`` compares with torch's plain passes):

* a repeated call (its subgraph traced at an earlier call) is recorded as the nodes the
  tracer would make for it, with the call's known value, instead of being dispatched through
  make_fx (a fake-tensor run and a cache key over all its operands); the placeholders only
  such calls read (their weights) are made directly rather than traced
  (:mod:`rewrite._private.torch_recording`);
* the graph modules made are torch's lazy ones
  (:func:`rewrite._private.torch_programs.lazy_graph_modules`), whose code is generated when first
  used rather than at every pass's recompile;
* the type promotion pass takes the value of every node no promotion rule applies to (an
  ``invoke_subgraph`` call, a placeholder, most ops) from its ``val`` instead of running it
  again under the fake mode (:func:`_promote_types`).

torchlib's registry is built by :mod:`rewrite._private.torchlib`. One decomposition differs
from torch.onnx's: ``aten.rsub.Scalar``'s number is a 0-d tensor (:func:`_rsub`), on which its
type promotion does not fail.

Anything missing or changed raises :class:`Unavailable`, an error of torch's own code on
the program (its decomposition, translation, the opset conversion) :class:`errors.TorchFailed`
(:func:`rewrite._private.errors.torch_code`); the caller then lowers the flat program (the
public ``torch.onnx.export``). An error raised in rewrite's own code run inside them (the
recorded calls, the kept names) is a bug and passes unchanged.

One private API of onnxscript, also here: its version converter's
node-by-node conversion (``_version_converter.convert_version``), which the public
``convert_version`` runs after inlining every function; :func:`convert_opset` runs it on the
model before inlining, so each distinct body is converted once (the public one is the
fallback).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import torch

from rewrite._private.torch_programs import lazy_graph_modules
from rewrite._private.errors import Unavailable, torch_code
from rewrite._private.torch_fake_cache import uncached
from rewrite._private.torch_graphs import with_graph_module
from rewrite._private.torch_recording import (
    Trace,
    placeholders_in_order,
    recording_apis,
    repeated_calls,
)
from rewrite._private.onnx_ir_inline import inline_functions
from rewrite._private.torchlib import from_torchlib

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["Unavailable", "available", "convert_opset", "decompose",
           "lowering_tables", "target_opset", "translate"]


@functools.lru_cache(maxsize=1)
def _apis() -> dict[str, Any]:
    try:
        from torch._dispatch.python import enable_python_dispatcher
        from torch._guards import TracingContext, detect_fake_mode, tracing
        from torch.export.exported_program import (
            _override_composite_implicit_decomp,
            _split_decomp_table_to_cia_and_python_decomp,
        )
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.onnx import _constants as onnx_constants
        from torch.onnx._internal.exporter import (
            _constants,
            _core,
            _decomp,
            _fx_passes,
        )
        return {
            "python_dispatcher": enable_python_dispatcher, "TracingContext": TracingContext,
            "detect_fake_mode": detect_fake_mode,
            "tracing": tracing, "override_cia": _override_composite_implicit_decomp,
            "split_table": _split_decomp_table_to_cia_and_python_decomp, "make_fx": make_fx,
            "to_onnx_program": _core._exported_program_to_onnx_program,
            "implemented": _decomp.get_onnx_implemented_overloads,
            "friendly_table": _decomp.create_onnx_friendly_decomposition_table,
            "type_promotion": _fx_passes.insert_type_promotion_nodes,
            "remove_assertions": _fx_passes.remove_assertion_nodes,
            "default_opset": onnx_constants.ONNX_DEFAULT_OPSET,
            "torchlib_opset": _constants.TORCHLIB_OPSET,
        }
    except (ImportError, AttributeError) as e:
        raise Unavailable(f"torch {torch.__version__}: {e}") from e


def available() -> str | None:
    """None if the private APIs are there, else why not."""
    try:
        _apis()
    except Unavailable as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=1)
def _registry_and_tables():
    """torchlib's registry and the decomposition tables (built once per process)."""
    api = _apis()
    # as torch.onnx.export (``_compat.export_compat``) builds it for its default opset
    try:
        registry = from_torchlib(max(api["default_opset"], api["torchlib_opset"]))
        _with_invoke_subgraph(registry)
        _with_complex(registry)
    except (ImportError, AttributeError) as e:  # pragma: no cover - not in the checked versions
        raise Unavailable(f"torch {torch.__version__}: {e}") from e
    return (registry, *_tables(registry))


def _with_complex(registry) -> None:
    """Translations torchlib lacks for complex tensors (Llama 4's and DeepSeek-V2's rotary
    embeddings, ``freqs_cis[:, :, None, :]``, given to each layer): the ONNX exporter holds a
    complex tensor as real and imaginary parts in a last axis of 2. ``aten.unsqueeze``: the
    new axis goes where it goes in the complex tensor, a negative one counted before that
    last axis; ``invoke_subgraph`` (a layer's call): the same call, its operand the real
    form its function takes."""
    from onnxscript import opset18

    def complex_unsqueeze(self, dim: int):
        axis = dim - 1 if dim < 0 else dim
        return opset18.Unsqueeze(self, opset18.Constant(value_ints=[axis]))

    hop = torch.ops.higher_order.invoke_subgraph
    calls = [f.onnx_function for f in registry.get_decomps(hop) if not f.is_complex]
    for op, function in ((torch.ops.aten.unsqueeze.default, complex_unsqueeze),
                         (hop, calls[0] if calls else None)):
        if function is not None and not any(f.is_complex for f in registry.get_decomps(op)):
            registry.register_op(op, function, is_complex=True)


def _with_invoke_subgraph(registry) -> None:
    """torch.onnx before 2.10 has no translation of ``invoke_subgraph``: register the one of
    later releases (``_torchlib/ops/hop.py``: a call of the body's function), with the
    ``call_op`` of that module, which 2.9 has."""
    hop = torch.ops.higher_order.invoke_subgraph
    if registry.is_registered(hop):
        return
    from torch.onnx._internal.exporter._torchlib.ops.hop import call_op

    def invoke_subgraph(subgraph: "ir.Function", identifier: str | None, *operands):
        subgraph.metadata_props["pkg.torch.ops.higher_order.invoke_subgraph.identifier"] = (
            str(identifier))
        return call_op(subgraph.name, *operands, _num_outputs=len(subgraph.outputs),
                       _domain=subgraph.domain)

    registry.register_op(hop, invoke_subgraph)


def _tables(registry) -> tuple[dict, dict]:
    """The CompositeImplicitAutograd ops to keep and the decomposition table for ``registry``
    (what it implements is not decomposed)."""
    api = _apis()
    table = api["friendly_table"](set(api["implemented"](registry)))
    cia, decompositions = api["split_table"](dict(table))
    if torch.ops.aten.rsub.Scalar in decompositions:
        decompositions[torch.ops.aten.rsub.Scalar] = _rsub
    return cia, decompositions


def _rsub(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
    """``aten.rsub.Scalar``, ``other - alpha * self``, with the number ``other`` a 0-d tensor
    of the result's dtype. torch's decomposition makes ``aten.sub.Tensor(number, tensor)``,
    which torch.onnx's type promotion pass fails on where the tensor must be cast (``1.0 -
    attention_mask`` on an int64 mask: XLNet), re-binding the number to no overload of
    ``aten.sub``; as a 0-d tensor of that dtype the result and its dtype are the same (a 0-d
    operand does not widen a dimensioned one of its category, and has the dtype the number
    promotes to)."""
    number = torch.scalar_tensor(other, dtype=torch.result_type(self, other),
                                 device=self.device)
    return torch.sub(number, self, alpha=alpha)


def lowering_tables(custom_translation_table: Mapping | None = None) -> tuple:
    """``(registry, cia, table)`` for :func:`decompose` and :func:`translate`: torchlib's,
    built once per process; with a custom translation table, a copy of that registry with
    the table's translations registered first, as torch.onnx.export registers them (and the
    tables of what it implements)."""
    if not custom_translation_table:
        return _registry_and_tables()
    base = _registry_and_tables()[0]
    registry = copy.copy(base)
    registry.functions = {key: list(value) for key, value in base.functions.items()}
    for torch_op, onnx_op in custom_translation_table.items():
        if isinstance(onnx_op, Sequence):  # torch.onnx.export refuses these (TypeError)
            raise Unavailable("a custom translation is a sequence of functions")
        registry.register_op(torch_op, onnx_op, is_complex=False)
    return (registry, *_tables(registry))


def decompose(program: torch.export.ExportedProgram, tables: tuple
              ) -> torch.export.ExportedProgram:
    """:func:`_decompose`; torch's errors raised as :class:`errors.TorchFailed`."""
    with torch_code():
        return _decompose(program, tables)


def _decompose(program: torch.export.ExportedProgram, tables: tuple
               ) -> torch.export.ExportedProgram:
    """``program`` decomposed as torch.onnx.export decomposes it, by a ``make_fx`` re-trace of
    its graph module (placeholders and outputs keep their names: the signature stays valid),
    with the tables of :func:`lowering_tables`. The program must be functional (no
    mutations); symbolic sizes stay those of the program's shape environment (the fake mode
    of its placeholders), with ``backed_size_oblivious`` as torch.onnx.export sets it."""
    api = _apis()
    _, cia, table = tables
    gm = program.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta["val"] for n in placeholders]
    fake_mode = api["detect_fake_mode"](values)
    if fake_mode is None:
        raise Unavailable("the program's placeholders carry no fake tensors")

    repeated, deferred = repeated_calls(gm) if recording_apis() else (set(), set())
    traced = [n for n in placeholders if n not in deferred]
    trace = Trace(gm, repeated, deferred)

    def run(*args):
        return trace.run(*args)

    # as run_decompositions: CompositeImplicitAutograd ops torchlib implements (linear, sdpa)
    # are kept through the python dispatcher; a TracingContext caches each invoke_subgraph
    # body's trace by identifier; no_grad skips the per-call schema re-trace of autograd.
    # Graph modules made here are lazy: their code is generated when first run (a body, once)
    # or read, not at each of the passes' recompiles (the translation reads graphs only)
    with lazy_graph_modules():
        with (torch.no_grad(), api["python_dispatcher"](), api["override_cia"](cia),
              api["tracing"](api["TracingContext"](fake_mode)), fake_mode, uncached(fake_mode),
              torch.fx.traceback.preserve_node_meta(),
              torch.fx.experimental._config.patch(backed_size_oblivious=True)):
            new = api["make_fx"](run, decomposition_table=table, tracing_mode="real")(
                *[n.meta["val"] for n in traced])
        placeholders_in_order(new.graph, placeholders, traced, trace.made)
        _keep_names(gm.graph, new.graph, placeholders)
        new.recompile()
        with torch.no_grad():
            _promote_types(new)
        new = api["remove_assertions"](new)
    return with_graph_module(program, new)


def _promote_types(gm: torch.fx.GraphModule) -> None:
    """torch.onnx's ``insert_type_promotion_nodes(gm)`` (each module of ``gm``: its
    ``InsertTypePromotion`` pass), except that the pass's interpreter takes the value of a
    node no promotion rule applies to from its ``val`` (set by the trace) instead of running
    it again under the fake mode: an ``invoke_subgraph`` call (~0.5 ms each: its body, a
    module of its own, is promoted once), a placeholder, an op without a rule. Promoting a
    node keeps its output type (a cast back is inserted), so the values after it stay what
    the trace made. Without the pass's private classes: ``insert_type_promotion_nodes`` as
    it is."""
    classes = _meta_value_promotion()
    if classes is None:  # pragma: no cover - not in the checked versions
        _apis()["type_promotion"](gm)
        return
    promotion_pass, interpreter = classes
    for module in gm.modules():
        promotion = promotion_pass(module)
        promotion.interpreter = interpreter(module, promotion.interpreter.type_promotion_table)
        promotion.run()


@functools.lru_cache(maxsize=1)
def _meta_value_promotion() -> tuple[type, type] | None:
    """torch.onnx's type promotion pass and its interpreter reading the values of nodes
    without a promotion rule from meta; None without them."""
    try:
        from torch.onnx._internal.fx.passes.type_promotion import (
            InsertTypePromotion,
            _TypePromotionInterpreter,
        )
        from torch.onnx._internal.fx.passes.type_promotion import (
            get_type_promotion_rule as get_rule,
        )
        hop = torch.ops.higher_order.invoke_subgraph
    except (ImportError, AttributeError):  # pragma: no cover - not in the checked versions
        return None

    class MetaValueInterpreter(_TypePromotionInterpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if "val" in n.meta and (n.op == "placeholder" or n.op == "call_function" and (
                    n.target is hop or get_rule(n, self.type_promotion_table) is None)):
                return n.meta["val"]
            return super().run_node(n)

    return InsertTypePromotion, MetaValueInterpreter


def _keep_names(old: torch.fx.Graph, new: torch.fx.Graph, placeholders: list) -> None:
    """Give ``new``'s placeholders and output values the names of ``old``'s."""
    fresh = [n for n in new.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in new.nodes}
    pairs = list(zip(placeholders, fresh))
    old_out = next(n for n in old.nodes if n.op == "output").args[0]
    new_out = next(n for n in new.nodes if n.op == "output").args[0]
    pairs += [(o, n) for o, n in zip(old_out, new_out)
              if isinstance(o, torch.fx.Node) and isinstance(n, torch.fx.Node)]
    for o, n in pairs:
        if n.name == o.name:
            continue
        clash = by_name.get(o.name)
        if clash is not None and clash is not n:
            clash.name = new._graph_namespace.create_name(o.name + "_", None)
            by_name[clash.name] = clash
        n.name = o.name
        if n.op == "placeholder":
            n.target = o.name
            if "val" not in n.meta:
                n.meta["val"] = o.meta.get("val")
        by_name[o.name] = n


def translate(decomposed: torch.export.ExportedProgram, tables: tuple) -> "ir.Model":
    """torch.onnx's translation of a decomposed program (each submodule: one function), with
    the registry of :func:`lowering_tables`."""
    registry = tables[0]
    to_onnx_program = _apis()["to_onnx_program"]
    with torch_code(), _without_call_metadata_warnings():
        model = to_onnx_program(decomposed, registry=registry).model
    align_local_domains(model)
    return model


class _CallMetadataWarnings(logging.Filter):
    """Drops torch.onnx's warning that an ``invoke_subgraph`` call has no ``nn_module_stack``:
    the calls are rewrite's (each one a layer's), their metadata is set after translation."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("nn_module_stack not found for node")


@contextlib.contextmanager
def _without_call_metadata_warnings() -> Iterator[None]:
    """``_CallMetadataWarnings`` on torch.onnx's exporter logger while the block runs."""
    logger = logging.getLogger("torch.onnx._internal.exporter._core")
    quiet = _CallMetadataWarnings()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def convert_opset(model: "ir.Model") -> None:
    """Convert ``model``'s main graph and each of its functions to :func:`target_opset` (as
    ``torch.onnx.export`` converts its model), functions left in place, but those whose
    nodes read a function attribute (torchlib's helpers with attributes, ``aten_softplus``:
    the converter refuses such nodes), inlined first where they are called. Without
    onnxscript's private converter: the public converter, which inlines every function
    first."""
    target = target_opset()
    if model.opset_imports.get("") == target:
        return
    try:
        from onnxscript.version_converter import _version_converter
        convert = _version_converter.convert_version
    except (ImportError, AttributeError):
        from onnxscript.version_converter import convert_version
        convert = convert_version
    with torch_code():
        if any(_reads_attributes(function) for function in model.functions.values()):
            inline_functions(model, _reads_attributes)
        convert(model, target_version=target)


def _reads_attributes(function: "ir.Function") -> bool:
    """Whether a node of ``function`` reads one of its attributes."""
    return any(attr.is_ref() for node in function for attr in node.attributes.values())


def align_local_domains(model: "ir.Model") -> None:
    """The model's version of each domain of its local functions given to every function
    importing it: torch.onnx imports the subgraph domain at its opset's version in the model
    and at 1 in a function whose ``Scan`` body calls a subgraph (inlining refuses the two)."""
    local = {function.domain for function in model.functions.values()}
    for function in model.functions.values():
        for domain in local & function.opset_imports.keys():
            if domain in model.opset_imports:
                function.opset_imports[domain] = model.opset_imports[domain]


def target_opset() -> int:
    """The opset torch.onnx.export converts its model to by default (``convert_version``)."""
    return _apis()["default_opset"]
