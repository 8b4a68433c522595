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

from rewrite._shared.gc import gc_paused
from rewrite.backends.onnx._opsets import fix_opsets
from rewrite.backends.onnx._standins import MustInline, Plan, Reuse
from rewrite.backends.onnx.distinct import Variant
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining import _naming as naming
from rewrite.backends.onnx.outlining._body_keys import Keyer, canonical_order
from rewrite.backends.onnx.outlining._boundary import boundary, owners
from rewrite.backends.onnx.outlining._call_sites import CallSites
from rewrite.backends.onnx.outlining._constants import (
    ConstantPolicy,
    Embedded,
    hoist_constants,
    weight_names,
)
from rewrite.backends.onnx.outlining._functions import Functions
from rewrite.backends.onnx.outlining._membership import Membership
from rewrite.backends.onnx.outlining._recompute import recompute_shared
from rewrite.backends.onnx.outlining._standin_calls import StandIns
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


class _Outliner:
    """Walks the tree bottom-up; per group, what replaces its members: a call of an earlier
    repeat's function, of one with an equal body key, of a new one, or of its first call's (a
    stand-in). Functions: :class:`Functions`; call sites: :class:`CallSites`; stand-ins:
    :class:`StandIns`."""

    def __init__(self, model: ir.Model, tree: GroupTree, options: OnnxOptions,
                 on_group: Callable[[Group], None] | None, plan: Plan | None = None) -> None:
        self.model, self.tree, self.on_group = model, tree, on_group
        graph = model.graph
        weights = weight_names(model)
        self.members = Membership.from_tree(tree, graph, *((plan.rows, plan.homes) if plan else ()))
        reuses = plan.reuses if plan is not None else {}
        # remat copies and removes only nodes without subgraphs: the owners stay the same
        owner = owners(graph)
        self.recomputed = (recompute_shared(graph, self.members, weights, owner)
                           if options.recompute else 0)
        self.position = self.members.position
        keyer = Keyer()
        hoist_constants(self.members, options, keyer)
        self.constants = ConstantPolicy(options, keyer, weights)
        self.sites = CallSites(graph, owner, self.position, tree.graph.root_class,
                               track=bool(reuses))
        self.functions = Functions(model, keyer, self.position)
        self.stand_ins = StandIns(reuses, self.sites.current, self.constants.key_of)
        self.function_of: dict[int, FunctionId | None] = {}

    def run(self) -> Outlined | MustInline:
        for group in self.tree.root.children:
            self._outline_subtree(group, [group])
        failed = self.stand_ins.failed
        if failed:  # stand-ins left in the graph: the result is thrown away
            return MustInline(failed, "stand-ins cannot call their first call's function")
        self.model.graph.sort()
        # constants now embedded in functions leave their initializers unused
        ir.passes.common.RemoveUnusedNodesPass()(self.model)
        made = self.functions.made
        fix_opsets(self.model, made)
        return Outlined(self.function_of, tuple(f.identifier() for f in made),
                        self.recomputed, self.tree.ids)

    def _outline_subtree(self, group: Group, chain: list[Group]) -> list[ir.Node]:
        """Outline ``group``; returns what stands for it in its parent's members."""
        naming.check_identity(group)
        reuse = self.stand_ins.reuses.get(group.index)
        if reuse is not None:
            return [self._stand_in(group, chain, reuse)]
        members = list(self.members.of(group.index))
        failed = len(self.stand_ins.failed)
        for child in group.children:
            members.extend(self._outline_subtree(child, chain + [child]))
        if len(self.stand_ins.failed) > failed:  # a stand-in below stays: thrown away
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
        snapshot = None
        # Repeated blocks reuse an earlier body's function and orders (see ``outlining._repeats``);
        # not for nodes holding subgraphs (canonical labels read captured values by name).
        if self.sites.holders.isdisjoint(members):
            raw_inputs, raw_outputs = boundary(members, member_set, self.sites.owner)
            if raw_outputs:
                raw_args, raw_embedded = self.constants.split(raw_inputs)
                constants = {v: e.key for v, e in raw_embedded.items()}
                identity = (group.domain, group.function_name)
                hit = self.functions.repeat(identity, members, raw_args, constants, raw_outputs)
                if hit is not None:  # the function's orders, from graph order
                    members = [members[i] for i in hit.member_order]
                    args = [raw_args[i] for i in hit.arg_order]
                    outputs = [raw_outputs[i] for i in hit.output_order]
                    return [self._call(group, chain, hit.function, args, outputs, members,
                                       member_set, first)]
                snapshot = self.functions.snapshot(identity, members, raw_args, constants,
                                                   raw_outputs)
        rank = {node: i for i, node in enumerate(members)}
        members = canonical_order(self.functions.keyer, members, rank, self.constants.key_of)
        inputs, outputs = boundary(members, member_set, self.sites.owner)
        if not outputs:
            self.function_of[group.index] = None
            return members
        args, embedded = self.constants.split(inputs)
        function, call = self._keyed_call(group, chain, members, member_set, first, args,
                                          embedded, outputs)
        if snapshot is not None:
            self.functions.remember(snapshot, function, [rank[n] for n in members], args,
                                    outputs)
        return [call]

    def _keyed_call(self, group: Group, chain: list[Group], members: list[ir.Node],
                    member_set: set[ir.Node], first: tuple, args: list[ir.Value],
                    embedded: dict[ir.Value, Embedded], outputs: list[ir.Value]
                    ) -> tuple[ir.Function, ir.Node]:
        """The function whose body key is that of ``members`` (made if new) and its call."""
        functions = self.functions
        key = functions.keyer.body((group.domain, group.function_name), members, args,
                                   {v: e.key for v, e in embedded.items()}, outputs)
        function = functions.keyed(key)
        if function is not None:
            return function, self._call(group, chain, function, args, outputs, members,
                                        member_set, first)
        name = functions.new_name(group)
        positions = self.stand_ins.positions(group, args, outputs)  # before the rewiring
        call = self.sites.insert(group, chain, name, args, outputs, members)
        self.sites.rewire(outputs, list(call.outputs), member_set)
        function = functions.make(group, name, key, members, args, embedded, outputs)
        self.stand_ins.note_first(group, function, positions)
        self.function_of[group.index] = function.identifier()
        self.position[call] = first
        return function, call

    def _call(self, group: Group, chain: list[Group], function: ir.Function,
              args: list[ir.Value], outputs: list[ir.Value], members: list[ir.Node],
              member_set: set[ir.Node], first: tuple) -> ir.Node:
        """``members`` replaced by a call of an existing ``function`` (noted if ``group`` is a
        first call's: its stand-ins call it too)."""
        self.stand_ins.note_first(group, function, self.stand_ins.positions(group, args,
                                                                            outputs))
        self.function_of[group.index] = function.identifier()
        return self.sites.replace(group, chain, function, args, outputs, members, member_set,
                                  first)

    def _stand_in(self, group: Group, chain: list[Group], reuse: Reuse) -> ir.Node:
        """The call of the first call's group's function that replaces a stand-in (its
        group's descendants call what the matching groups call); when that is not what
        outlining its nodes would give, the node stays (the call marked failed)."""
        node = reuse.node
        if self.on_group is not None:
            for inner in group.walk():
                self.on_group(inner)
        found = self.stand_ins.call(reuse, self.members.only_member(group, node))
        if found is None:
            return node
        for inner in group.walk():
            match = reuse.groups.get(inner.index)
            self.function_of[inner.index] = self.function_of.get(match) \
                if match is not None else None
        return self._call(group, chain, found.function, found.args, found.outputs, [node],
                          {node}, self.position[node])


def outline(model: ir.Model, tree: GroupTree, options: OnnxOptions | None = None,
            on_group: Callable[[Group], None] | None = None, plan: Plan | None = None
            ) -> Outlined | MustInline:
    """Outline every group of ``tree`` (built on ``model``'s main graph; with ``plan``, read
    with its stand-ins) in place; the stand-ins that cannot call their first call's function
    (only with a ``plan``): :class:`_standins.MustInline`."""
    with gc_paused():  # many short-lived IR objects: collections would only slow it down
        return _Outliner(model, tree, options or OnnxOptions(), on_group, plan).run()
