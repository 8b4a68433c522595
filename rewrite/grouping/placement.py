"""Where nodes without a module stack go: with their users.

A node with an unknown stack (no ``nn_module_stack``, e.g. ``get_attr`` constants, or nodes an
optimizer made) takes the longest common prefix of its users' stacks, so a constant used by
one block is recomputed inside that block's function, and one used by several blocks stays
in their common parent. A node whose users are all unknown too is resolved after them
(reverse topological order); a node with no users goes to its producers' common prefix, or
the top level. Graph inputs and outputs always stay at the top level.
"""

from __future__ import annotations

from rewrite.ir import Graph, Stack


def common_prefix(a: Stack, b: Stack) -> Stack:
    if a is b:
        return a
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] is b[i]:
        i += 1
    return a if i == len(a) else a[:i]


def place_nodes(graph: Graph, users: list[list[int]]) -> list[Stack]:
    """The effective stack of every node."""
    nodes = graph.nodes
    stacks: list[Stack | None] = [n.stack for n in nodes]
    empty: Stack = ()
    for node in nodes:
        if node.is_io:
            stacks[node.index] = empty
    for i in range(len(nodes) - 1, -1, -1):
        if stacks[i] is not None:
            continue
        found: Stack | None = None
        for u in users[i]:
            s = stacks[u]
            if s is None:
                continue
            if nodes[u].is_io:
                found = empty
                break
            found = s if found is None else common_prefix(found, s)
            if not found:
                break
        stacks[i] = found
    for i, s in enumerate(stacks):
        if s is None:  # dead code: go with producers
            found = None
            for p in nodes[i].inputs:
                ps = stacks[p] or empty
                found = ps if found is None else common_prefix(found, ps)
            stacks[i] = found or empty
    return stacks  # type: ignore[return-value]
