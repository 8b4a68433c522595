"""Outline groups into nested, deduplicated model-local functions, bottom-up, in place.

For each group, children first: its members are its own ONNX nodes plus the call nodes that
replaced its children. Values its members read from outside are the function's inputs
(weights, buffers, activations; small constants are embedded, see ``outlining._constants``); values
read outside or returned by the graph are its outputs. The body's structural key decides: a new
function, or a call of an existing one with an equal body (12 identical blocks -> one function,
12 calls). A call node replaces the members; readers outside switch to its outputs.

Grouping has checked that collapsing the groups level by level creates no cycle, so every call
node can be placed; the main graph and each body are topologically sorted once built.

Stand-ins (a :class:`_standins.Plan`): a call of the per-body lowering that was not inlined is
one node, the one member of its group. That group becomes a call of the function its first
call's group got, the arguments and outputs picked by position in the torch call (each
recorded when the first call's group is outlined, through the values outlining replaced).
When that is not exactly what outlining the inlined call would give, the groups above it
are left as they are, the other groups are outlined, and the run returns a
:class:`_standins.MustInline` naming every such call (the model is then thrown away: the
lowering inlines those calls and starts again).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import onnx_ir as ir
import onnx_ir.passes.common
from attrs import field, frozen

from rewrite._gc import gc_paused
from rewrite.backends.onnx.outlining import _naming as naming
from rewrite.backends.onnx.outlining._boundary import boundary, detach, owners, rewire, substitute
from rewrite.backends.onnx.outlining._constants import (
    ConstantPolicy,
    Embedded,
    hoist_constants,
    weight_names,
)
from rewrite.backends.onnx.distinct import Variant
from rewrite.backends.onnx.outlining._membership import Membership
from rewrite.backends.onnx._opsets import fix_opsets
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining._recompute import recompute_shared
from rewrite.backends.onnx.outlining._repeats import Body, Reference, Repeats
from rewrite.backends.onnx._standins import MustInline, Plan, Reuse
from rewrite.backends.onnx.outlining._body_keys import Key, Keyer
from rewrite.backends.onnx.summary import FunctionId
from rewrite.grouping import Group, GroupTree


@frozen
class Outlined:
    """What outlining did: per group, the function called (``None`` when left flat)."""

    by_group: dict[int, FunctionId | None]
    """Group id (in the tree's :attr:`~GroupTree.table`) -> the function its call calls."""
    functions: tuple[FunctionId, ...]
    """The functions made, in the order they were made."""
    recomputed: int = 0
    """Nodes copied into groups by ``outlining._recompute`` (shared cheap nodes recomputed per
    group); a stand-in's group (see ``_standins``) has no nodes to copy into: the copies inside it
    are those of its first call's group, in the function both call, counted once."""
    ids: Sequence[str] = field(default=(), repr=False)
    """The tree's display ids (:attr:`GroupTree.ids`), for :attr:`function_of`."""
    variants: tuple[Variant, ...] = ()
    """Per group identity made into more than one function, each function beside the first
    and why it is not the first (filled by merging, see ``distinct``)."""

    @property
    def function_of(self) -> dict[str, FunctionId | None]:
        """:attr:`by_group` by display id (``h.0/h.0.attn``), for people and reports."""
        ids = self.ids
        return {ids[k]: fid for k, fid in self.by_group.items()}

    @property
    def calls(self) -> Counter:
        """Call sites per function (one per outlined group)."""
        return Counter(f for f in self.by_group.values() if f is not None)


@frozen
class _Snapshot:
    """A body outlined for the first time, as :class:`Repeats` will match later repeats."""

    body: Body
    """``Repeats.snapshot`` of the body."""
    args: list[ir.Value]
    """Its arguments and outputs in member order (before the canonical order)."""
    outputs: list[ir.Value]

    def reference(self, function: ir.Function, member_order: list[int],
                  args: list[ir.Value], outputs: list[ir.Value]) -> Reference:
        """The :class:`Reference` to ``function``, made from this body in these orders."""
        arg_index = {v: i for i, v in enumerate(self.args)}
        output_index = {v: i for i, v in enumerate(self.outputs)}
        return Reference(self.body, function, member_order, [arg_index[v] for v in args],
                         [output_index[v] for v in outputs])


class _Outliner:
    def __init__(self, model: ir.Model, tree: GroupTree, options: OnnxOptions,
                 on_group: Callable[[Group], None] | None, plan: Plan | None = None) -> None:
        self.model = model
        self.graph = model.graph
        self.tree = tree
        self.on_group = on_group
        weights = weight_names(model)
        self.members = (Membership.from_tree(tree, self.graph) if plan is None else
                        Membership.from_tree(tree, self.graph, plan.rows, plan.homes))
        self.reuses = plan.reuses if plan is not None else {}
        self.templates = {r.first_group: r.template for r in self.reuses.values()}
        self.firsts = set(self.templates)
        self.renamed: dict[ir.Value, ir.Value] = {}
        """Values outlining replaced (outputs of members) -> their replacements."""
        self.positions: dict[int, tuple | None] = {}
        """Per first call's group: its function, and its arguments, outputs and embedded
        constants by position in the torch call (None: stand-ins cannot call it)."""
        self.failed: set[int] = set()
        # remat copies and removes only nodes without subgraphs: the owners stay the same
        self.owner = owners(self.graph)
        self.recomputed = (recompute_shared(self.graph, self.members, weights, self.owner)
                           if options.recompute else 0)
        self.position = self.members.position
        self.keyer = Keyer()
        hoist_constants(self.members, options, self.keyer)
        self.constants = ConstantPolicy(options, self.keyer, weights)
        self.names = naming.FunctionNames(((f.domain, f.name) for f in model.functions.values()),
                                           functions=True)
        self.registry: dict[Key, ir.Function] = {}
        self.repeats = Repeats(self.keyer)
        self.holders = set(self.owner.values())
        self.function_of: dict[int, FunctionId | None] = {}
        self.made: list[ir.Function] = []

    def run(self) -> Outlined | MustInline:
        for group in self.tree.root.children:
            self._outline_subtree(group, [group])
        if self.failed:  # stand-ins left in the graph: the result is thrown away
            return MustInline(self.failed, "stand-ins cannot call their first call's function")
        self.graph.sort()
        # constants now embedded in functions leave their initializers unused
        ir.passes.common.RemoveUnusedNodesPass()(self.model)
        fix_opsets(self.model, self.made)
        return Outlined(self.function_of, tuple(f.identifier() for f in self.made),
                        self.recomputed, self.tree.ids)

    def _outline_subtree(self, group: Group, chain: list[Group]) -> list[ir.Node]:
        """Outline ``group``; returns what stands for it in its parent's members."""
        naming.check_identity(group)
        reuse = self.reuses.get(group.index)
        if reuse is not None:
            return [self._stand_in(group, chain, reuse)]
        members = list(self.members.of(group.index))
        failed = len(self.failed)
        for child in group.children:
            members.extend(self._outline_subtree(child, chain + [child]))
        if len(self.failed) > failed:  # a stand-in below stays: this model is thrown away
            return []
        if self.on_group is not None:
            self.on_group(group)
        if not members:
            self.function_of[group.index] = None
            return []
        return self._outline(group, chain, members)

    def _outline(self, group: Group, chain: list[Group], members: list[ir.Node]
                 ) -> list[ir.Node]:
        """Replace ``members`` (``group``'s, children outlined) by a call of a function: an
        earlier repeat's, one with an equal body key, or a new one; when nothing they compute
        is used, leave them flat (dead code) and return them."""
        member_set = set(members)
        first = min(self.position[m] for m in members)
        members.sort(key=self.position.__getitem__)
        identity = (group.domain, group.function_name)
        snapshot = None
        # Repeated blocks reuse an earlier body's function and orders (see ``outlining._repeats``);
        # not for nodes holding subgraphs (canonical labels read captured values by name).
        if self.holders.isdisjoint(members):
            found = self._repeat(group, chain, identity, members, member_set, first)
            if isinstance(found, ir.Node):
                return [found]
            snapshot = found
        rank = {node: i for i, node in enumerate(members)}
        members = self.keyer.canonical_order(members, rank, self._constant_key)
        inputs, outputs = boundary(members, member_set, self.owner)
        if not outputs:
            self.function_of[group.index] = None
            return members
        args, embedded = self.constants.split(inputs)
        function, call = self._keyed_call(group, chain, identity, members, member_set, first,
                                          args, embedded, outputs)
        if snapshot is not None:
            self.repeats.add(snapshot.reference(function, [rank[n] for n in members], args,
                                                outputs))
        return [call]

    def _repeat(self, group: Group, chain: list[Group], identity: tuple[str, str],
                members: list[ir.Node], member_set: set[ir.Node], first: tuple
                ) -> "ir.Node | _Snapshot | None":
        """The call of an earlier repeat's function that replaces ``members``, else what a
        later repeat needs of this body (None: it has no outputs)."""
        raw_inputs, raw_outputs = boundary(members, member_set, self.owner)
        if not raw_outputs:
            return None
        raw_args, raw_embedded = self.constants.split(raw_inputs)
        constants = {v: e.key for v, e in raw_embedded.items()}
        hit = self.repeats.find(identity, members, raw_args, constants, raw_outputs)
        if hit is None:
            body = self.repeats.snapshot(identity, members, raw_args, constants, raw_outputs)
            return _Snapshot(body, raw_args, raw_outputs)
        members = [members[i] for i in hit.member_order]
        args = [raw_args[i] for i in hit.arg_order]
        outputs = [raw_outputs[i] for i in hit.output_order]
        self._note_first(group, hit.function, self._positions(group, args, outputs))
        return self._reuse(group, chain, hit.function, args, outputs, members, member_set,
                           first)

    def _keyed_call(self, group: Group, chain: list[Group], identity: tuple[str, str],
                    members: list[ir.Node], member_set: set[ir.Node], first: tuple,
                    args: list[ir.Value], embedded: dict[ir.Value, Embedded],
                    outputs: list[ir.Value]) -> tuple[ir.Function, ir.Node]:
        """The function whose body key is that of ``members`` (made if new) and its call."""
        key = self.keyer.body(identity, members, args, {v: e.key for v, e in embedded.items()},
                              outputs)
        function = self.registry.get(key)
        if function is not None:
            self._note_first(group, function, self._positions(group, args, outputs))
            call = self._reuse(group, chain, function, args, outputs, members, member_set, first)
            return function, call
        name = self.names.new(group.domain, group.function_name)
        positions = self._positions(group, args, outputs)  # before the rewiring
        call = self._call(group, chain, name, args, outputs, members)
        self._rewire(outputs, list(call.outputs), member_set)
        function = self.registry[key] = self._make_function(group, name, members, args,
                                                            embedded, outputs)
        self._note_first(group, function, positions)
        self.function_of[group.index] = function.identifier()
        self.position[call] = first
        return function, call

    def _reuse(self, group: Group, chain: list[Group], function: ir.Function,
               args: list[ir.Value], outputs: list[ir.Value], members: list[ir.Node],
               member_set: set[ir.Node], first: tuple) -> ir.Node:
        """Replace ``members`` (in ``function``'s order) by a call of ``function``."""
        call = self._call(group, chain, function.name, args, outputs, members)
        self._rewire(outputs, list(call.outputs), member_set)
        self._drop(members, member_set)
        self.function_of[group.index] = function.identifier()
        self.position[call] = first
        return call

    def _rewire(self, old: list[ir.Value], new: list[ir.Value], member_set: set[ir.Node]) -> None:
        """:func:`_boundary.rewire`, remembering the replacements (see :meth:`_current`)."""
        if self.firsts:
            self.renamed.update(zip(old, new))
        rewire(self.graph, old, new, member_set, self.owner)

    def _current(self, value: ir.Value) -> ir.Value:
        """The value that now stands for ``value`` (after outlining replaced it)."""
        while value in self.renamed:
            value = self.renamed[value]
        return value

    def _note_first(self, group: Group, function: ir.Function, positions: tuple | None) -> None:
        if group.index in self.firsts:
            self.positions[group.index] = (function, *positions) if positions else None

    def _positions(self, group: Group, args: list[ir.Value], outputs: list[ir.Value]
                   ) -> tuple | None:
        """For a first call's group (its outputs not yet rewired): its arguments and outputs
        by position in the torch call and the constants it embeds (what its stand-ins need,
        see :meth:`_stand_in`); None when they are not all the call's."""
        template = self.templates.get(group.index)
        if template is None:
            return None
        inputs = [self._current(v) if v is not None else None for v in template.inputs]
        at = {v: p for p, v in enumerate(inputs) if v is not None}
        made = {self._current(v): j for j, v in enumerate(template.outputs) if v is not None}
        arg_at, out_at = [at.get(v) for v in args], [made.get(v) for v in outputs]
        if None in arg_at or None in out_at:
            return None
        return arg_at, out_at, self._embedded_keys(inputs)

    def _embedded_keys(self, values: Sequence[ir.Value | None]) -> list:
        """Per value, the key of the constant embedded for it (None: an argument, or unread)."""
        return [self._constant_key(v) if v is not None else None for v in values]

    def _stand_in(self, group: Group, chain: list[Group], reuse: Reuse) -> ir.Node:
        """The call of the first call's group's function that replaces a stand-in (its
        group's descendants call what the matching groups call); when that is not what
        outlining its nodes would give, the node stays and the call is marked failed."""
        node = reuse.node
        if self.on_group is not None:
            for inner in group.walk():
                self.on_group(inner)
        found = self.positions.get(reuse.first_group)
        if found is None or not self._only_member(group, node) \
                or len(set(node.inputs)) != len(node.inputs):
            self.failed.add(reuse.call)
            return node
        function, arg_at, out_at, embedded = found
        used = {j for j, v in enumerate(node.outputs) if v.uses() or v.is_graph_output()}
        read = [v if t is not None else None for v, t in zip(node.inputs, reuse.template.inputs)]
        if used != set(out_at) or len(out_at) != len(used) \
                or self._embedded_keys(read) != embedded:
            self.failed.add(reuse.call)
            return node
        args = [node.inputs[p] for p in arg_at]  # type: ignore[index]
        outputs = [node.outputs[j] for j in out_at]  # type: ignore[index]
        for inner in group.walk():
            match = reuse.groups.get(inner.index)
            self.function_of[inner.index] = self.function_of.get(match) \
                if match is not None else None
        return self._reuse(group, chain, function, args, outputs, [node], {node},
                           self.position[node])

    def _only_member(self, group: Group, node: ir.Node) -> bool:
        """``node`` is the one node of ``group`` and its descendants
        (``outlining._recompute`` added none)."""
        return self.members.of(group.index) == [node] and not any(
            self.members.of(inner.index) for inner in group.walk() if inner is not group)

    def _drop(self, members: list[ir.Node], member_set: set[ir.Node]) -> None:
        """Remove the members of a group whose function exists. Only inputs made outside
        need detaching: values made inside leave with their producers (readers outside
        were rewired to the call)."""
        for node in members:
            if node in self.holders:  # its subgraphs hold nodes
                detach(node)
                continue
            for i, value in enumerate(node.inputs):
                if value is not None and value.producer() not in member_set:
                    node.replace_input_with(i, None)
        self.graph.remove(members)

    def _constant_key(self, value: ir.Value) -> Key | None:
        found = self.constants.embedded(value)
        return found.key if found is not None else None

    def _call(self, group: Group, chain: list[Group], name: str, args: list[ir.Value],
              outputs: list[ir.Value], members: list[ir.Node]) -> ir.Node:
        results = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]
        call = ir.Node(
            group.domain, name, args, outputs=results, name=group.id,
            metadata_props=naming.call_metadata(chain, self.tree.graph.root_class),
        )
        self.graph.insert_before(members[0], call)
        return call

    def _make_function(self, group: Group, name: str, members: list[ir.Node],
                       args: list[ir.Value], embedded: dict[ir.Value, Embedded],
                       outputs: list[ir.Value]) -> ir.Function:
        internal = {v.name for node in members for v in node.outputs}
        internal.update(constant.name for constant in embedded.values())
        names = naming.input_names(args, group, internal)
        params = [ir.Value(name=n, type=v.type, shape=v.shape) for n, v in zip(names, args)]
        mapping: dict[ir.Value, ir.Value] = dict(zip(args, params))
        constant_nodes = []
        for value, constant in embedded.items():
            node = constant.make_node()
            mapping[value] = node.outputs[0]
            constant_nodes.append(node)
        self.graph.remove(members)
        for node in members:
            substitute(node, mapping)
        body = ir.Graph(params, outputs, name=name,
                        nodes=constant_nodes + sorted(members, key=self.position.__getitem__))
        body.sort()
        function = ir.Function(group.domain, name, graph=body, attributes=())
        self.model.functions[function.identifier()] = function
        self.made.append(function)
        return function


def outline(model: ir.Model, tree: GroupTree, options: OnnxOptions | None = None,
            on_group: Callable[[Group], None] | None = None, plan: Plan | None = None
            ) -> Outlined | MustInline:
    """Outline every group of ``tree`` (built on ``model``'s main graph; with ``plan``, read
    with its stand-ins) in place; the stand-ins that cannot call their first call's function
    (only with a ``plan``): :class:`_standins.MustInline`."""
    with gc_paused():  # many short-lived IR objects: collections would only slow it down
        return _Outliner(model, tree, options or OnnxOptions(), on_group, plan).run()
