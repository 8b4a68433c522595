"""Every private torch API the per-body lowering (:mod:`perbody`) uses, in one place.

Checked against torch 2.13.0 (with onnxscript 0.7.2). torch.onnx.export(program) runs, in
``torch.onnx._internal.exporter._core``: ``_prepare_exported_program_for_export``
(``run_decompositions`` with the ONNX decomposition table, an AOT-autograd re-trace of the
whole program, then explicit type promotion and the removal of assertion nodes) and
``_exported_program_to_onnx_program`` (the op-by-op translation, one ONNX function per
submodule of the graph module: ``invoke_subgraph`` bodies become local functions). The
per-body lowering does the same two steps, except that the decomposition is a ``make_fx``
re-trace (no AOT export, no functionalization) under the same decomposition table, the same
preserved CompositeImplicitAutograd ops and a ``TracingContext``, whose invoke_subgraph cache
traces each subgraph identifier once. Two shortcuts keep the cost of each further call low,
the result the same: the graph modules made are torch's lazy ones
(:func:`rewrite._torch_private.lazy_graph_modules`), whose code is generated when first used
rather than at every pass's recompile, and the type promotion pass takes an
``invoke_subgraph`` call's value from its ``val`` instead of running the body again
(:func:`_promote_types`). torchlib's registry is built by :mod:`torchlib`.

Anything missing or changed raises :class:`Unavailable`; the caller then lowers the flat
program (the public ``torch.onnx.export``).

One private API of onnxscript (checked with 0.7.2), also here: its version converter's
node-by-node conversion (``_version_converter.convert_version``), which the public
``convert_version`` runs after inlining every function; :func:`convert_opset` runs it on the
model before inlining, so each distinct body is converted once (the public one is the
fallback).
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from rewrite._torch_private import lazy_graph_modules
from rewrite.backends.onnx.torchlib import from_torchlib

if TYPE_CHECKING:
    import onnx_ir as ir

CHECKED_TORCH_VERSIONS = ("2.13.0",)


class Unavailable(Exception):
    """The private APIs are not what this module was written against."""


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
        raise Unavailable(f"torch {torch.__version__}: {e}") from None


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
    except (ImportError, AttributeError) as e:  # pragma: no cover - not in the checked versions
        raise Unavailable(f"torch {torch.__version__}: {e}") from None
    return (registry, *_tables(registry))


def _tables(registry) -> tuple[dict, dict]:
    """The CompositeImplicitAutograd ops to keep and the decomposition table for ``registry``
    (what it implements is not decomposed)."""
    api = _apis()
    table = api["friendly_table"](set(api["implemented"](registry)))
    return api["split_table"](dict(table))


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
    """``program`` decomposed as torch.onnx.export decomposes it, by a ``make_fx`` re-trace of
    its graph module (placeholders and outputs keep their names: the signature stays valid),
    with the tables of :func:`lowering_tables`. The program must be functional (no
    mutations), with static shapes."""
    api = _apis()
    _, cia, table = tables
    gm = program.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta["val"] for n in placeholders]
    fake_mode = api["detect_fake_mode"](values)
    if fake_mode is None:
        raise Unavailable("the program's placeholders carry no fake tensors")

    repeated, deferred = _repeated_calls(gm) if _call_again_apis() else (set(), set())
    traced = [n for n in placeholders if n not in deferred]
    trace = _Trace(gm, repeated, deferred)

    def run(*args):
        return trace.run(*args)

    # as run_decompositions: CompositeImplicitAutograd ops torchlib implements (linear, sdpa)
    # are kept through the python dispatcher; a TracingContext caches each invoke_subgraph
    # body's trace by identifier; no_grad skips the per-call schema re-trace of autograd.
    # Graph modules made here are lazy: their code is generated when first run (a body, once)
    # or read, not at each of the passes' recompiles (the translation reads graphs only)
    with lazy_graph_modules():
        with (torch.no_grad(), api["python_dispatcher"](), api["override_cia"](cia),
              api["tracing"](api["TracingContext"](fake_mode)), fake_mode,
              torch.fx.traceback.preserve_node_meta(),
              torch.fx.experimental._config.patch(backed_size_oblivious=True)):
            new = api["make_fx"](run, decomposition_table=table, tracing_mode="real")(
                *[n.meta["val"] for n in traced])
        _placeholders_in_order(new.graph, placeholders, traced, trace.made)
        _keep_names(gm.graph, new.graph, placeholders)
        new.recompile()
        with torch.no_grad():
            _promote_types(new)
        new = api["remove_assertions"](new)
    decomposed = copy.copy(program)
    decomposed._graph_module = new
    return decomposed


_HOP = getattr(getattr(torch.ops, "higher_order", None), "invoke_subgraph", None)


@functools.lru_cache(maxsize=1)
def _call_again_apis() -> dict[str, Any] | None:
    """What :class:`_Trace` needs to record a repeated call itself; None without it."""
    try:
        from torch._higher_order_ops.invoke_subgraph import get_invoke_subgraph_cache
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, track_tensor_tree
        from torch.fx.proxy import TracerBase
    except ImportError:  # pragma: no cover - not in the checked versions
        return None
    if _HOP is None:  # pragma: no cover - not in the checked versions
        return None
    return {"cache": get_invoke_subgraph_cache, "proxy_mode": get_proxy_mode,
            "track": track_tensor_tree, "create_node": TracerBase.create_node}


def _repeated_calls(gm: torch.fx.GraphModule
                    ) -> tuple[set[torch.fx.Node], set[torch.fx.Node]]:
    """The ``invoke_subgraph`` calls of ``gm`` whose subgraph an earlier call traces (their
    values known: a tuple of tensors), and the placeholders only they read."""
    seen: set[object] = set()
    repeated: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _HOP:
            continue
        identifier = node.args[1]
        val = node.meta.get("val")
        if identifier in seen and isinstance(val, tuple) \
                and all(isinstance(v, torch.Tensor) for v in val) \
                and all(isinstance(a, torch.fx.Node) for a in node.args[2:]):
            repeated.add(node)
        seen.add(identifier)
    deferred = {n for n in gm.graph.nodes if n.op == "placeholder" and n.users
                and all(user in repeated for user in n.users)}
    return repeated, deferred


class _Deferred:
    """The value of a placeholder only repeated calls read (not traced)."""

    __slots__ = ("node",)

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node


class _Trace(torch.fx.Interpreter):
    """Runs a program under ``make_fx``; a repeated ``invoke_subgraph`` call (its subgraph
    traced at an earlier call, :func:`_repeated_calls`) is recorded as the call node the
    tracer would make, with the call's known value, instead of dispatching it (a fake-tensor
    run of the call, a cache key over all its operands: ~1 ms each); the placeholders only
    such calls read are made directly (:attr:`made`), not traced."""

    def __init__(self, gm: torch.fx.GraphModule, repeated: set[torch.fx.Node],
                 deferred: set[torch.fx.Node]) -> None:
        super().__init__(gm)
        self.repeated = repeated
        self.deferred = deferred
        self.made: dict[torch.fx.Node, torch.fx.Node] = {}
        """Each deferred placeholder -> the placeholder made for it in the traced graph."""
        self._tracked: set[int] = set()
        self._paths: dict[int, str] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n in self.deferred:
            return _Deferred(n)
        if n in self.repeated:
            out = self._call_again(n)
            if out is not None:
                return out
        return super().run_node(n)

    def _call_again(self, n: torch.fx.Node) -> Any:
        api = _call_again_apis()
        mode = api["proxy_mode"]()
        cache = api["cache"]()
        identifier = n.args[1]
        body = cache.get_proxy_dispatch_entry(identifier) if cache is not None else None
        out = n.meta["val"]
        if mode is None or body is None or any(id(v) in self._tracked for v in out):
            return None
        tracer = mode.tracer
        operands = []
        for arg in n.args[2:]:
            value = self.env[arg]
            if isinstance(value, _Deferred):
                operands.append(self._placeholder(tracer, value.node))
                continue
            proxy = tracer.unwrap_proxy(value) if isinstance(value, torch.Tensor) else None
            if not isinstance(proxy, torch.fx.Proxy):
                return None
            operands.append(proxy.node)
        path = self._paths.get(id(body))
        if path is None:
            path = next((name for name, m in tracer.root.named_modules() if m is body), None)
            if path is None:
                return None
            self._paths[id(body)] = path
        create = api["create_node"]
        with self._set_current_node(n):
            # the nodes the tracer makes (a get_attr of the subgraph, the call), without the
            # call's ``eager_input_vals`` (a detached copy of every operand's value, for
            # Inductor's stride checks)
            getter = create(tracer, "get_attr", path, (), {})
            node = create(tracer, "call_function", _HOP, (getter, identifier, *operands), {})
            api["track"](out, tracer.proxy(node), constant=None, tracer=tracer)
        self._tracked.update(id(v) for v in out)
        return out

    def _placeholder(self, tracer: Any, original: torch.fx.Node) -> torch.fx.Node:
        made = self.made.get(original)
        if made is None:
            # the program's value (make_fx's would be a detached copy: not worth ~30 us each,
            # the translation reads shapes and types) and tensor metadata
            made = tracer.graph.placeholder(original.name)
            made.meta.update({k: original.meta[k] for k in ("val", "tensor_meta")
                              if k in original.meta})
            self.made[original] = made
        return made


def _placeholders_in_order(graph: torch.fx.Graph, placeholders: list[torch.fx.Node],
                           traced: list[torch.fx.Node],
                           made: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """``graph``'s placeholders (``traced``'s, in order, then those :class:`_Trace` made)
    moved to the start, in the order of the program's ``placeholders``."""
    if not made:
        return
    fresh = iter(n for n in graph.nodes if n.op == "placeholder" and n not in made.values())
    by_original = {original: next(fresh) for original in traced}
    by_original.update(made)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for original in placeholders:
        first.prepend(by_original[original])


def _promote_types(gm: torch.fx.GraphModule) -> None:
    """torch.onnx's ``insert_type_promotion_nodes(gm)`` (each module of ``gm``: its
    ``InsertTypePromotion`` pass), except that the pass's interpreter takes the value of an
    ``invoke_subgraph`` call from the call's ``val`` (set by the trace) instead of running
    the body again under the fake mode (~0.5 ms per call; no type promotion rule applies to
    the call itself, and its body is a module of its own, promoted once). Without the
    pass's private classes: ``insert_type_promotion_nodes`` as it is."""
    classes = _meta_call_promotion()
    if classes is None:  # pragma: no cover - not in the checked versions
        _apis()["type_promotion"](gm)
        return
    promotion_pass, interpreter = classes
    for module in gm.modules():
        promotion = promotion_pass(module)
        promotion.interpreter = interpreter(module, promotion.interpreter.type_promotion_table)
        promotion.run()


@functools.lru_cache(maxsize=1)
def _meta_call_promotion() -> tuple[type, type] | None:
    """torch.onnx's type promotion pass and its interpreter with ``invoke_subgraph`` calls
    read from meta; None without them."""
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

    class MetaCallInterpreter(_TypePromotionInterpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if "val" in n.meta and (n.op == "placeholder" or n.op == "call_function" and (
                    n.target is hop or get_rule(n, self.type_promotion_table) is None)):
                return n.meta["val"]
            return super().run_node(n)

    return InsertTypePromotion, MetaCallInterpreter


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
    return _apis()["to_onnx_program"](decomposed, registry=registry).model


def convert_opset(model: "ir.Model") -> None:
    """Convert ``model``'s main graph and each of its functions to :func:`target_opset` (as
    ``torch.onnx.export`` converts its model), functions left in place. Without onnxscript's
    private converter, or when a function's node reads a function attribute (the converter
    refuses those): the public converter, which inlines every function first."""
    target = target_opset()
    if model.opset_imports.get("") == target:
        return
    refs = any(attr.is_ref() for function in model.functions.values() for node in function
               for attr in node.attributes.values())
    try:
        from onnxscript.version_converter import _version_converter
        convert = _version_converter.convert_version
    except (ImportError, AttributeError):
        refs = True
    if refs:
        from onnxscript.version_converter import convert_version
        convert = convert_version
    convert(model, target_version=target)


def target_opset() -> int:
    """The opset torch.onnx.export converts its model to by default (``convert_version``)."""
    return _apis()["default_opset"]
