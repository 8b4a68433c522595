"""Per-body lowering of an ExportedProgram: decompose and translate each distinct body once.

``torch.onnx.export`` decomposes the whole flat program (an AOT-autograd re-trace) and
translates it op by op: a 48-block model is decomposed and translated 48 times. Here:

1. The outermost groups whose bodies repeat become calls of one shared subgraph per distinct
   body: ``torch.ops.higher_order.invoke_subgraph(body, identifier, *inputs)``, weights and
   every value from outside passed as inputs (:func:`_invoke_subgraph.rebuild`). Bodies are the
   same when their nodes are (ops, arguments, scalars; the shapes and types of their inputs,
   symbolic sizes by name: a symbolic size read from outside is an input too)
   and so are their group subtrees, tags and leaving nodes.
2. :mod:`rewrite._private.torch_exporter` decomposes that program with torch.onnx's decomposition
   table (``make_fx``; the TracingContext's invoke_subgraph cache traces each body once, and each
   further call of a body is recorded without being run) and
   translates it with torch.onnx's translator, which makes one ONNX function per subgraph
   (:class:`DecomposedProgram`: decomposed once, translated again if calls must be inlined,
   :meth:`DecomposedProgram.translate`).
3. Each body is converted to torch.onnx.export's opset once. The *first* call of each body is
   inlined (:mod:`rewrite._private.onnx_ir_inline`), each inlined node marked with its call; the
   other calls stay one node each, standing in for the nodes inlining would give (:mod:`_standins`;
   a call whose outputs are used unlike the first's, and every call when asked or under the
   ``input`` constant policy, is inlined too, its nodes' metadata (module paths in ``name_scopes`` /
   ``namespace``) that of its own call). A :data:`Resolver` gives each node the module
   stack, op target and tags of the node of the grouped program it came from (worked out
   once per body node; inlined nodes only: a stand-in's rows get their facts from its own
   call's FX nodes, position by position).

The rest of the ``.pt2`` path (regroup, outline, optimize, merge) reads the stand-ins as
their nodes (``frontends.onnx.Expansion``) and makes each a call of its first call's
function, so the result is what the flat path gives, while the cost of the repeated calls is
a few list entries each, not their nodes.

:class:`Unsupported` says why a program cannot take this path (the caller falls back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

import onnx_ir as ir
import torch
from attrs import evolve, field, frozen
from onnx_ir.passes import common as common_passes

from rewrite._shared.gc import gc_paused
from rewrite._private import torch_exporter
from rewrite._private.errors import Unavailable, torch_code
from rewrite._private.torch_graphs import functional_forms, is_higher_order, is_in_place
from rewrite._private.onnx_ir_inline import inline_functions
from rewrite._private.torch_repeated_calls import inputs_apart
from rewrite.backends.onnx._standins import DOMAIN as STANDIN_DOMAIN
from rewrite.backends.onnx._standins import (
    MustInline,
    Plan,
    StandIn,
    Template,
    make_template,
    plan,
    stand_in,
)
from rewrite.backends.onnx.lowering._invoke_subgraph import SUBGRAPH_OPS, Unsupported, rebuild
from rewrite.backends.onnx.lowering._provenance import nearest, node_facts
from rewrite.frontends.onnx.graph import (
    CLASS_HIERARCHY,
    NAME_SCOPES,
    NAMESPACE,
    Expansion,
    NodeFacts,
    Resolver,
    read_scopes,
    string_list,
)
from rewrite.grouping import GroupTree

if TYPE_CHECKING:
    from rewrite.ir import Node

CALL_KEY = "rewrite.perbody.call"
"""ONNX node metadata while lowering: index of the call an inlined node belongs to."""
_SUBGRAPH_DOMAIN = "pkg.torch.__subgraph__"
_INLINED_HOPS = tuple(getattr(torch.ops.higher_order, name) for name in (
    "wrap_with_set_grad_enabled", "wrap_with_autocast")
    if hasattr(torch.ops.higher_order, name))
"""Higher-order ops that decomposition inlines (their bodies are plain ops), outside the
repeated bodies (a group holding one is not made a shared body)."""
__all__ = ["MustInline", "Translation", "DecomposedProgram", "Unsupported", "check", "functional",
           "in_place"]


@frozen
class Translation:
    """The ONNX model (calls inlined or standing) and how to group its nodes."""

    model: ir.Model
    resolver: Resolver
    bodies: int
    """Distinct bodies decomposed and translated once each."""
    calls: int
    """Grouped calls that reused them."""
    inlined: int = 0
    """The number of grouped calls inlined (the first of each body, and those that cannot
    stand in)."""
    stand_ins: Mapping[ir.Node, StandIn] = field(factory=dict)
    """The other calls, by their standing node."""
    templates: Mapping[int, Template] = field(factory=dict)
    """Per first call with stand-ins, its inlined nodes."""
    group_ids: tuple[str, ...] = ()
    """Per call, its group's display id."""
    plan: Plan | None = None
    """The outliner's :class:`_standins.Plan`, once grouped (:meth:`planned`)."""

    @property
    def expansions(self) -> dict[ir.Node, Expansion]:
        """What each standing node stands for, for the ONNX frontend."""
        return {node: s.expansion for node, s in self.stand_ins.items()}

    def planned(self, tree: GroupTree) -> "Translation | MustInline":
        """This with the :attr:`plan` for ``tree`` (grouped from this model), or the calls
        that cannot stand in (:func:`_standins.plan`)."""
        if not self.stand_ins:
            return self
        found = plan(tree, self.model.graph, self.stand_ins, self.templates, self.group_ids)
        return found if isinstance(found, MustInline) else evolve(self, plan=found)


def in_place(program: torch.export.ExportedProgram) -> bool:
    """Whether ``program`` has in-place ops (torch.export's training IR keeps them: a static
    KV cache's ``index_copy_``) other than those lowered in their functional form as they
    are (a write into a tensor made inside the program that nothing reads afterwards:
    :func:`~rewrite._private.torch_graphs.functional_forms`); :func:`functional` removes
    them."""
    forms = functional_forms(program.graph)
    return any(is_in_place(node) and node not in forms for node in program.graph.nodes)


def functional(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without in-place ops: torch's functionalization
    (``run_decompositions({})``, nothing decomposed), which writes each mutation as a new
    value that the program returns (its signature says which buffer or input it updates).
    An AOT-autograd re-trace of the flat program: the one step of this path whose cost grows
    with the model rather than with its distinct bodies; inputs sharing a fake tensor (an
    extended program's further layers) are given their own first
    (:func:`~rewrite._private.torch_repeated_calls.inputs_apart`). torch's errors:
    :class:`TorchFailed`."""
    inputs_apart(program)
    with torch_code():
        return program.run_decompositions({})


def check(program: torch.export.ExportedProgram, *, in_place_ok: bool = False) -> None:
    """Raise :class:`Unsupported` for programs this path does not handle (mutations are
    handled in their functional form, see :func:`functional`; ``in_place_ok``: before it,
    so that a program it would not make fit is not functionalized for nothing),
    :class:`Unavailable` when torch's private exporter APIs are not those its shim was
    written against."""
    reason = torch_exporter.available()
    if reason is not None:
        raise Unavailable(f"torch's private exporter APIs changed ({reason})")
    signature = program.graph_signature
    if getattr(signature, "backward_signature", None) is not None:
        raise Unsupported("the program is a joint forward/backward graph")
    forms = functional_forms(program.graph)
    for node in program.graph.nodes:
        if is_higher_order(node.target) \
                and node.target not in (*_INLINED_HOPS, *SUBGRAPH_OPS):
            raise Unsupported(f"the program has a higher-order op ({node.target.name()})")
        if is_in_place(node) and node not in forms and not in_place_ok:  # :func:`functional`
            raise Unsupported(f"the program has an in-place op ({node.target})")


def _path_map(first: "list[Node]", this: "list[Node]") -> dict[str, str]:
    """Module paths of the first call -> the same modules' paths in this call."""
    out: dict[str, str] = {}
    for a, b in zip(first, this):
        if a.stack is None or b.stack is None:
            continue
        for ca, cb in zip(a.stack, b.stack):
            if ca.path != cb.path:
                out[ca.path] = cb.path
    return out


def _repath(props: dict[str, str], paths: dict[str, str], parsed: dict[str, Any]) -> None:
    """Module paths in a node's ``name_scopes`` / ``namespace`` mapped by ``paths``;
    ``parsed`` caches the texts' parts."""
    scopes = props.get(NAME_SCOPES)
    if scopes:
        if scopes not in parsed:
            parsed[scopes] = string_list(scopes)
        items = parsed[scopes]
        if items is not None:
            props[NAME_SCOPES] = repr([paths.get(s, s) for s in items])
    namespace = props.get(NAMESPACE)
    if namespace:
        key = ("namespace", namespace)
        if key not in parsed:
            parsed[key] = [part.partition(": ") for part in namespace.split("/")]
        props[NAMESPACE] = "/".join(paths.get(path, path) + sep + rest
                                    for path, sep, rest in parsed[key])


class DecomposedProgram:
    """One program decomposed once (steps 1-2); :meth:`translate` translates and inlines it,
    again with more calls inlined when they cannot stand in (:class:`_standins.MustInline`)."""

    def __init__(self, program: torch.export.ExportedProgram, tree: GroupTree,
                 custom_translation_table: Mapping | None = None) -> None:
        # the collector paused: the many objects made here (fake tensors, FX and ONNX nodes)
        # live until the end, and each collection would also scan the program's (measured:
        # the inlining took 5-8x longer with it)
        with gc_paused():
            self.tree = tree
            self.tables = torch_exporter.lowering_tables(custom_translation_table)
            rebuilt, self.calls = rebuild(program, tree)
            self.decomposed = torch_exporter.decompose(rebuilt, self.tables)

    def translate(self, must_inline: frozenset[int] = frozenset(), *,
                  stand_ins: bool = True) -> Translation | MustInline:
        """Translate and inline: the first call of each body, every call in ``must_inline``
        and, without ``stand_ins``, every call; the others stand in (:mod:`_standins`). The
        calls whose first call's inlined nodes cannot be copied: :class:`MustInline`."""
        with gc_paused():
            return _Translator(self, must_inline, stand_ins).run()


class _Translator:
    """One translation of a :class:`DecomposedProgram` (see :meth:`DecomposedProgram.translate`)."""

    def __init__(self, source: DecomposedProgram, must_inline: frozenset[int],
                 stand_ins: bool) -> None:
        self.calls = source.calls
        self.decomposed = source.decomposed
        self.model = torch_exporter.translate(source.decomposed, source.tables)
        self.graph = source.tree.graph
        self.must_inline = must_inline
        self.stand_ins = stand_ins

    def run(self) -> Translation | MustInline:
        calls = self.calls
        call_nodes, facts = self._mark_calls()
        standing, input_names, names = self._inline(call_nodes)
        firsts = set(input_names)
        inlined = self._unmark(standing, facts, firsts)
        templates = {f: self._template(inlined[f], input_names[f], names[f]) for f in firsts}
        uncopied = [i for i in standing if templates[calls[i].first] is None]
        if uncopied:
            return MustInline(uncopied, "a first call's inlined nodes cannot be copied")
        # a first call whose stand-ins were all inlined (inside another body) needs no copy
        templates = {f: t for f, t in templates.items() if t is not None}
        at = {f: [facts.position(f, n) for n in t.nodes] for f, t in templates.items()}
        expansions = {}
        for index, node in standing.items():
            first = calls[index].first
            template = templates[first]
            expansions[node] = stand_in(node, index, first, template, [
                facts.of_call(index, p, n) for p, n in zip(at[first], template.nodes)])
        distinct = len({call.first for call in calls})
        return Translation(self.model, facts, distinct, len(calls),
                       len(calls) - len(standing), expansions, templates,
                       tuple(call.group.id for call in calls))

    def _mark_calls(self) -> "tuple[dict[int, ir.Node], _Facts]":
        """Every call node of the translated model marked with its call (``CALL_KEY``): the
        call nodes by call, and the facts of the model's nodes (read while marked)."""
        main = {n.name: n for n in self.decomposed.graph_module.graph.nodes}
        call_by_name = {call.name: i for i, call in enumerate(self.calls)}
        bodies: dict[int, dict[str, torch.fx.Node]] = {}
        call_nodes: dict[int, ir.Node] = {}
        for node in self.model.graph:
            if node.domain != _SUBGRAPH_DOMAIN:
                continue
            scopes = read_scopes(node)
            fx_call = main.get(scopes[0][-1]) if scopes else None
            origin = _origin_call(fx_call, call_by_name)
            if origin is None:
                raise Unsupported(f"cannot tell which call ONNX node {node.name} is")
            node.metadata_props[CALL_KEY] = str(origin)
            call_nodes[origin] = node
            getter = fx_call.args[0]
            body = getattr(self.decomposed.graph_module, getter.target)
            bodies[origin] = {n.name: n for n in body.graph.nodes}
        return call_nodes, _Facts(self.calls, self.graph, main, bodies)

    def _inline(self, call_nodes: dict[int, ir.Node]) -> tuple[
            dict[int, ir.Node], dict[int, list[str | None]], dict[int, list[str | None]]]:
        """Convert the opset, leave the stand-ins, inline the rest: the calls left standing,
        and per first call of a stand-in the names of its inputs and outputs.

        torch.onnx.export converts its model to its default opset (onnxscript's converter
        inlines every function first): here each body is converted once, then inlined (the
        bodies, torchlib's helpers: each inlined node keeps its call's marks); dead nodes go
        (the translation of a re-traced graph can leave a dead Constant that the flat export
        does not have; it would upset outlining)."""
        model = self.model
        torch_exporter.convert_opset(model)
        _read_inputs_passed_through(model, call_nodes.values())
        standing = self._stand_ins(call_nodes)
        firsts = {self.calls[i].first for i in standing}
        input_names = {f: [v.name if v is not None else None for v in call_nodes[f].inputs]
                       for f in firsts}
        names = {f: [v.name for v in call_nodes[f].outputs] for f in firsts}
        inline_functions(model)
        # (torch.onnx 2.9 leaves torchlib helpers no node calls: Rank, IsScalar)
        for cleanup in (common_passes.RemoveUnusedNodesPass(),
                        common_passes.RemoveUnusedFunctionsPass(),
                        common_passes.RemoveUnusedOpsetsPass()):
            cleanup(model)
        standing = {i: n for i, n in standing.items() if n.graph is model.graph}
        return standing, input_names, names

    def _path_maps(self, standing: dict[int, ir.Node]) -> dict[int, dict[str, str]]:
        """Module paths of the first call -> this call's, for the other calls inlined."""
        calls, graph = self.calls, self.graph
        repathed = [i for i, call in enumerate(calls) if call.first != i and i not in standing]
        ir_nodes = {i: [graph.nodes[j] for j in calls[i].group.all_nodes()]
                    for i in {*repathed, *(calls[i].first for i in repathed)}}
        return {i: _path_map(ir_nodes[calls[i].first], ir_nodes[i]) for i in repathed}

    def _unmark(self, standing: dict[int, ir.Node], facts: "_Facts", firsts: set[int]
                ) -> dict[int, list[ir.Node]]:
        """Resolve every node while the marks are there, then repath the other calls' nodes
        and drop the marks; the inlined nodes of each first call in ``firsts``."""
        path_maps = self._path_maps(standing)
        parsed: dict[str, Any] = {}
        inlined: dict[int, list[ir.Node]] = {f: [] for f in firsts}
        standing_nodes = set(standing.values())
        for node in self.model.graph:
            if node in standing_nodes:
                node.metadata_props.pop(CALL_KEY, None)
                continue
            facts(node)
            mark = node.metadata_props.pop(CALL_KEY, None)
            if mark is None:
                continue
            index = int(mark)
            if index in path_maps:
                _repath(node.metadata_props, path_maps[index], parsed)
            elif index in inlined:
                inlined[index].append(node)
        return inlined

    def _template(self, nodes: list[ir.Node], input_names: list[str | None],
                  output_names: list[str | None]) -> Template | None:
        """The template of a first call inlined as ``nodes`` (None: its stand-ins cannot
        copy it): inlining kept the names of the call's outputs, and of its inputs (an
        inlined call's outputs, maybe, whose values it replaced), so both are found again
        by name."""
        made = {v.name: v for n in nodes for v in n.outputs if v.name is not None}
        outer = {v.name: v for n in nodes for v in n.inputs
                 if v is not None and v.name is not None and v.name not in made}
        return make_template(nodes, [outer.get(n) if n else None for n in input_names],
                             [made.get(n) if n else None for n in output_names])

    def _stand_ins(self, call_nodes: dict[int, ir.Node]) -> dict[int, ir.Node]:
        """The calls left standing (their nodes moved to :data:`_standins.DOMAIN`): not the
        first of their body, not to be materialized, their outputs used as the first's are."""
        if not self.stand_ins:
            return {}
        standing = {}
        used = {i: [bool(v.uses()) or v.is_graph_output() for v in node.outputs]
                for i, node in call_nodes.items()}
        for index, node in call_nodes.items():
            first = self.calls[index].first
            if first == index or index in self.must_inline or first not in call_nodes \
                    or used[index] != used[first]:
                continue
            node.domain = STANDIN_DOMAIN
            standing[index] = node
        return standing


def _read_inputs_passed_through(model: ir.Model, calls: Iterable[ir.Node]) -> None:
    """Where a body returns one of its inputs as it is (an op that decomposition made an
    identity, its value read outside the group), the readers of that output of each call
    read the call's input instead, and the output is left unnamed: inlining would give the
    input the output's name (``replace_nodes_and_values``), and the values of the calls
    before are found by name (:meth:`_Translator._template`). torch.onnx.export's flat
    model reads the input too."""
    for node in calls:
        function = model.functions.get(node.op_identifier())
        if function is None:
            continue
        position = {id(value): i for i, value in enumerate(function.inputs)}
        for output, value in zip(function.outputs, node.outputs):
            i = position.get(id(output))
            if i is None or value.is_graph_output() or i >= len(node.inputs) \
                    or node.inputs[i] is None:
                continue
            value.replace_all_uses_with(node.inputs[i])
            value.name = None


class _Facts:
    """The :data:`Resolver` of a translated model: the module stack, op target and tags of
    the grouped program's node each ONNX node came from, worked out once per node. The nodes
    of every call of one body carry the same metadata texts until repathed, and come from the
    same decomposed body nodes: parsed and traced back once per body node."""

    def __init__(self, calls, graph, main: dict[str, torch.fx.Node],
                 bodies: dict[int, dict[str, torch.fx.Node]]) -> None:
        self.calls = calls
        self.main = main
        """The decomposed program's nodes by name."""
        self.bodies = bodies
        """Per call, its decomposed body's nodes by name."""
        self.ir_by_name = {node.name: node for node in graph.nodes}
        self.body_index = [{n.name: i for i, n in enumerate(call.nodes)} for call in calls]
        self.first_names = {first: {n.name: n for n in calls[first].nodes}
                            for first in {call.first for call in calls}}
        self.facts: dict[int, NodeFacts | None] = {}
        self.scopes_of: dict[tuple, Any] = {}
        self.position_of: dict[tuple[int, str], int | None] = {}

    def __call__(self, onnx_node: ir.Node) -> NodeFacts:
        key = id(onnx_node)
        if key not in self.facts:
            self.facts[key] = self._resolve(onnx_node)
        return self.facts[key]

    def _scopes(self, onnx_node: ir.Node) -> Any:
        props = onnx_node.metadata_props
        key = (props.get(NAME_SCOPES), props.get(CLASS_HIERARCHY))
        if key not in self.scopes_of:
            self.scopes_of[key] = read_scopes(onnx_node)
        return self.scopes_of[key]

    def position(self, index: int, onnx_node: ir.Node) -> int | None:
        """Position in its call's body of the FX node an inlined node came from."""
        scopes = self._scopes(onnx_node)
        if scopes is None:
            return None
        first = self.calls[index].first
        key = (first, scopes[0][-1])
        if key not in self.position_of:
            fx = self.bodies.get(index, {}).get(scopes[0][-1])
            source = nearest(fx, self.first_names[first]) if fx is not None else None
            self.position_of[key] = (self.body_index[first].get(source.name)
                                     if source is not None else None)
        return self.position_of[key]

    def of_call(self, index: int, at: int | None, onnx_node: ir.Node) -> NodeFacts:
        """The facts of the node at position ``at`` of call ``index``'s body."""
        original = (self.ir_by_name.get(self.calls[index].nodes[at].name)
                    if at is not None else None)
        return node_facts(original, onnx_node)

    def _resolve(self, onnx_node: ir.Node) -> NodeFacts:
        mark = onnx_node.metadata_props.get(CALL_KEY)
        if mark is not None:
            index = int(mark)
            return self.of_call(index, self.position(index, onnx_node), onnx_node)
        scopes = self._scopes(onnx_node)
        original = None
        if scopes is not None:
            fx = self.main.get(scopes[0][-1])
            if fx is not None and fx.op != "placeholder":
                original = nearest(fx, self.ir_by_name)
        return node_facts(original, onnx_node)


def _origin_call(fx_call: torch.fx.Node | None, call_by_name: dict[str, int]) -> int | None:
    if fx_call is None:
        return None
    return nearest(fx_call, call_by_name)
