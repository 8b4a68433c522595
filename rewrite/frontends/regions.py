"""Module stacks of higher-order op regions that the tracer recorded at the root.

A higher-order op (``wrap_with_set_grad_enabled`` for a ``torch.no_grad()`` block,
``invoke_subgraph``, ``cond``...) runs a body graph held by a ``get_attr`` submodule. In strict
exports (``torch.export.export(..., strict=True)``) the op node, its body's ``get_attr`` and the
``getitem`` nodes that unpack its results may carry only the root module's stack entry, while
the body's own nodes carry the full stack of the module that ran the region (the rotary
embedding of a Llama). Read as they are, such nodes sit at the top level, between the nodes
of that module: the module cannot be outlined.

:func:`region_metas` gives such nodes the stack their body agrees on (the longest common prefix
of the body nodes' stacks), when it is deeper than their own.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

_STACK = "nn_module_stack"


def region_metas(fx_nodes: list[torch.fx.Node]) -> dict[int, dict]:
    """Per node index, a replacement ``meta`` for the nodes of a region recorded at the root
    (see the module docstring); empty when there is none."""
    holders = [n for n in fx_nodes if n.op == "get_attr"]
    if not holders:
        return {}
    owner = fx_nodes[0].graph.owning_module
    bodies = {}
    for holder in holders:
        body = _attr(owner, holder.target)
        if isinstance(body, torch.fx.GraphModule):
            bodies[holder] = body
    if not bodies:
        return {}
    changed: dict[torch.fx.Node, list] = {}
    for holder, body in bodies.items():
        stack = _common_stack(body)
        if not stack:
            continue
        for op_node in holder.users:
            if not _root_only(op_node) or len(stack) <= len(_items(op_node)):
                continue
            for node in (holder, op_node, *op_node.users):
                if node is op_node or node is holder or node.target is operator.getitem:
                    if _root_only(node) and node not in changed:
                        changed[node] = stack
    if not changed:
        return {}
    position = {node: i for i, node in enumerate(fx_nodes)}
    return {position[node]: {**node.meta, _STACK: dict(stack)}
            for node, stack in changed.items()}


def _attr(owner: Any, target: Any) -> Any:
    value = owner
    for part in str(target).split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _items(node: torch.fx.Node) -> list:
    stack = node.meta.get(_STACK)
    return list(stack.items()) if isinstance(stack, dict) else []


def _root_only(node: torch.fx.Node) -> bool:
    """Whether the node's stack is absent, empty or only the root entry (path ``""``)."""
    items = _items(node)
    return all(isinstance(v, tuple) and len(v) == 2 and v[0] == "" for _, v in items)


def _common_stack(body: torch.fx.GraphModule) -> list:
    """The longest common prefix of the stacks of the body's operations (recursing into
    nested bodies through their own operations only)."""
    common: list | None = None
    for node in body.graph.nodes:
        if node.op != "call_function":
            continue
        items = _items(node)
        if not items:
            continue
        if common is None:
            common = items
            continue
        size = 0
        for a, b in zip(common, items):
            if a != b:
                break
            size += 1
        common = common[:size]
        if not common:
            return []
    return common or []
