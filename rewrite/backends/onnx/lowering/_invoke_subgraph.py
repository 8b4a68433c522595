"""Step 1 of the per-body lowering (:mod:`lowering._perbody`): the program with
``invoke_subgraph`` calls.

The outermost groups whose bodies repeat become calls of one shared subgraph per distinct
body: ``torch.ops.higher_order.invoke_subgraph(body, identifier, *inputs)``, weights and every
value from outside passed as inputs (:func:`rebuild`). Bodies are the same when their nodes
are (ops, arguments, scalars; the shapes and types of their inputs: ``_shared.fx_keys.body_key``),
their groups are (which body node sits in which group of the subtree, by position; the groups'
function names and domains), their nodes' tags are, and the same nodes leave the body
(:func:`_group_key`). Calls of one body then give the same function (all but the first are
not even inlined, see :mod:`_standins`).
"""

from __future__ import annotations

import operator
from typing import Hashable, Mapping

import numpy as np
import torch
from attrs import frozen

from rewrite._shared.fx_keys import body_key
from rewrite._private.torch_graphs import (
    functional_forms,
    is_higher_order,
    is_metadata_only,
    with_graph_module,
)
from rewrite._private.torch_programs import LazyGraphModule
from rewrite.grouping import GroupTree
from rewrite.grouping.tree import Group


class Unsupported(Exception):
    """Why this program cannot be lowered per body."""


@frozen
class Call:
    """One grouped call turned into an ``invoke_subgraph`` call."""

    group: Group
    nodes: tuple[torch.fx.Node, ...]
    """The call's nodes in the grouped program, in body order."""
    first: int
    """Index (in the list of calls) of the first call of the same body: its subgraph's source."""
    name: str
    """Name of the ``invoke_subgraph`` node in the rebuilt program."""


def _outputs(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    members = set(nodes)
    return [n for n in nodes if any(user not in members for user in n.users)]


Forms = Mapping[torch.fx.Node, torch._ops.OpOverload]
"""In-place ops of the program copied as their functional overloads
(:func:`~rewrite._private.torch_graphs.functional_forms`)."""


def _copy(graph: torch.fx.Graph, node: torch.fx.Node,
          env: dict[torch.fx.Node, torch.fx.Node], forms: Forms) -> torch.fx.Node:
    """``node`` copied into ``graph``, its arguments mapped by ``env``; an op that changes
    only autograd metadata (``detach_``) is not copied: its value is its argument's (a
    program's one in-place op then needs no functional form, nor torch.onnx a translation);
    an in-place op of ``forms`` is copied as its functional form."""
    if is_metadata_only(node):
        return env[node.args[0]]
    copied = graph.node_copy(node, lambda a: env[a])
    if node in forms:
        copied.target = forms[node]
    return copied


def _subgraph(owner: torch.fx.GraphModule, nodes: list[torch.fx.Node],
              inputs: list[torch.fx.Node], forms: Forms) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, value in enumerate(inputs):
        placeholder = graph.placeholder(f"input_{i}")
        placeholder.meta["val"] = value.meta.get("val")
        env[value] = placeholder
    for node in nodes:
        env[node] = _copy(graph, node, env, forms)
    graph.output(tuple(env[o] for o in _outputs(nodes)))
    return LazyGraphModule(owner, graph)


def _group_key(tree: GroupTree, group: Group, indices: list[int],
               nodes: list[torch.fx.Node]) -> Hashable:
    """What else two calls of one body must share to give one function: the shape of the
    group's subtree (``GroupTree.subtree_shape``), each node's tags, which nodes leave."""
    shape = tree.subtree_shape(group.index, indices)
    tagged = tuple(tree.tags_id[np.asarray(indices, dtype=np.int64)].tolist())  # one tree's ids
    members = set(nodes)
    leaving = tuple([k for k, n in enumerate(nodes) if any(u not in members for u in n.users)])
    return shape, tagged, leaving


SUBGRAPH_OPS = (torch.ops.higher_order.scan,)
"""Higher-order ops that a shared body may hold (each body lowered with its subgraph once;
torch.onnx translates a ``scan`` to an ONNX ``Scan``)."""


def _shareable(node: torch.fx.Node) -> bool:
    """Whether ``node`` may be in a shared body: an op (not a higher-order one, but those of
    :data:`SUBGRAPH_OPS`) or the subgraph such an op reads."""
    if node.op == "get_attr":
        return all(user.target in SUBGRAPH_OPS for user in node.users)
    return node.op == "call_function" and (not is_higher_order(node.target)
                                           or node.target in SUBGRAPH_OPS)


Chosen = tuple[Group, list[torch.fx.Node], Hashable, list[torch.fx.Node]]
"""A group whose body repeats, its nodes, its key and its inputs (``body_key``'s)."""


def _selected(tree: GroupTree, by_index) -> list[Chosen]:
    """The outermost groups whose body repeats (descending into groups that do not)."""
    keyed: dict[int, tuple[Hashable, list, list]] = {}
    counts: dict[Hashable, int] = {}

    def visit(group: Group) -> None:
        indices = group.all_nodes()
        nodes = [by_index(i) for i in indices]
        if not all(_shareable(n) for n in nodes):
            key, inputs = ("not shared", group.index), []  # a constant or another op inside
        else:
            key, inputs = body_key(nodes)
            key = (key, _group_key(tree, group, indices, nodes))
            if any(isinstance(i.meta.get("val"), (tuple, list)) for i in inputs):
                # it unpacks a higher-order op's results (HRM's torch.no_grad() steps,
                # wrap_with_set_grad_enabled): an invoke_subgraph operand is a tensor or size
                key, inputs = ("not shared", group.index), []
        keyed[group.index] = (key, nodes, inputs)
        counts[key] = counts.get(key, 0) + 1

    level = list(tree.root.children)
    chosen: list[Chosen] = []
    while level:
        for group in level:
            visit(group)
        below = []
        for group in level:
            key, nodes, inputs = keyed[group.index]
            if counts[key] > 1:
                chosen.append((group, nodes, key, inputs))
            else:
                below.extend(group.children)
        level = below
    return chosen


def rebuild(program: torch.export.ExportedProgram, tree: GroupTree
            ) -> tuple[torch.export.ExportedProgram, list[Call]]:
    """A copy of ``program`` whose repeated groups call one shared subgraph per body, the
    in-place ops that need no functionalization in their functional form
    (:func:`~rewrite._private.torch_graphs.functional_forms`)."""
    source = program.graph_module
    forms = functional_forms(source.graph)
    gm = LazyGraphModule(source, torch.fx.Graph())
    plans, calls = _bodies(gm, source, tree, forms)
    _Emitter(gm.graph, plans, calls, forms).emit(source.graph)
    graph = gm.graph
    for node in graph.nodes:  # subgraphs of the program's own higher-order ops
        if node.op == "get_attr" and not hasattr(gm, node.target):
            value = source.get_submodule(node.target) if "." not in node.target else None
            if value is None:
                raise Unsupported(f"cannot copy attribute {node.target}")
            gm.register_module(node.target, value)
    graph.lint()
    gm.recompile()  # lazy: its code is made if it runs (decomposing reads the graph)
    return with_graph_module(program, gm), calls


@frozen
class _CallPlan:
    """What the ``invoke_subgraph`` call of one grouped call reads and makes."""

    attr: str
    """The attribute of the rebuilt graph module that holds its body."""
    inputs: list[torch.fx.Node]
    outputs: list[torch.fx.Node]


def _bodies(gm: torch.fx.GraphModule, source: torch.fx.GraphModule, tree: GroupTree,
            forms: Forms) -> tuple[list[_CallPlan], list[Call]]:
    """One subgraph per distinct body registered on ``gm``; per grouped call, its plan and
    :class:`Call`."""
    nodes_of = tree.graph.nodes
    bodies: dict[Hashable, tuple[str, int]] = {}
    plans: list[_CallPlan] = []
    calls: list[Call] = []
    for index, (group, nodes, key, inputs) in enumerate(
            _selected(tree, lambda i: nodes_of[i].source)):
        if key not in bodies:
            attr = f"body_{len(bodies)}"
            gm.register_module(attr, _subgraph(source, nodes, inputs, forms))
            bodies[key] = (attr, index)
        attr, first = bodies[key]
        plans.append(_CallPlan(attr, inputs, _outputs(nodes)))
        calls.append(Call(group, tuple(nodes), first, f"rewrite_call_{index}"))
    return plans, calls


class _Emitter:
    """Writes the rebuilt graph: the program's nodes in their order, each grouped call as one
    ``invoke_subgraph`` call when all its inputs exist and before any user of its outputs (a
    valid order exists: grouping checked that collapsing groups keeps a DAG)."""

    def __init__(self, graph: torch.fx.Graph, plans: list[_CallPlan], calls: list[Call],
                 forms: Forms) -> None:
        self.graph = graph
        self.forms = forms
        self.plans = plans
        self.calls = calls
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.done: set[int] = set()
        self.owner_of = {node: index for index, call in enumerate(calls) for node in call.nodes}

    def emit(self, source: torch.fx.Graph) -> None:
        env, owner_of = self.env, self.owner_of
        pending = [n for n in source.nodes]
        ready_inputs = [set(plan.inputs) for plan in self.plans]
        while pending:
            progressed = False
            rest = []
            for node in pending:
                index = owner_of.get(node)
                if index is not None:
                    if index in self.done:
                        continue
                    if all(v in env for v in ready_inputs[index]):
                        self._call(index)
                        progressed = True
                    else:
                        rest.append(node)
                    continue
                if all(a in env for a in node.all_input_nodes):
                    env[node] = _copy(self.graph, node, env, self.forms)
                    progressed = True
                else:
                    rest.append(node)
            rest = [n for n in rest if owner_of.get(n) not in self.done]
            if not progressed and rest:  # a call made late in a pass leaves none of its nodes
                raise Unsupported("the grouped calls cannot be ordered (data leaves a group "
                                  "and comes back)")
            pending = rest

    def _call(self, index: int) -> None:
        plan, graph, env = self.plans[index], self.graph, self.env
        getter = graph.get_attr(plan.attr)
        call = graph.create_node("call_function", torch.ops.higher_order.invoke_subgraph,
                                 (getter, plan.attr, *[env[v] for v in plan.inputs]),
                                 name=self.calls[index].name)
        call.meta["val"] = tuple(o.meta.get("val") for o in plan.outputs)
        for j, out in enumerate(plan.outputs):
            # named as the node it stands for: the signature names program outputs
            item = graph.create_node("call_function", operator.getitem, (call, j),
                                     name=out.name)
            item.meta["val"] = out.meta.get("val")
            env[out] = item
        self.done.add(index)
