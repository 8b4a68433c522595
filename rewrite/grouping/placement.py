"""Where nodes without a module stack go: with their users.

A node whose stack is unknown (no ``nn_module_stack``: ``get_attr`` constants, nodes a pass or
an optimizer made) takes the longest common prefix of its users' stacks. So a constant used by
one block goes inside that block (and is recomputed in its function), one used by several
blocks stays in their common parent, and one read by the graph output stays at the top level.
But a node that sits between two nodes of one call, a producer (or the nearest producer with
a stack, through nodes without one) and a user in it (a residual ``Add`` whose metadata was
stripped, read in its block and by the next), goes into the deepest such call: left outside,
data would leave the call and come back. Users whose own stack is
unknown are placed first (reverse topological order). A node with no placed user (dead code)
takes the common prefix of its producers' stacks, or the top level. Graph inputs and outputs
always stay at the top level.

Nodes recorded at the top level whose producers and users all lie inside one deeper call (a
region a strict export recorded at the root) are placed the same way (``enclosed_at_root``).

Unknown nodes whose users are all known and in one stack (the common case) are placed in one
array pass; the others one by one, users first.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from rewrite.grouping.stacks import StackTable
from rewrite.ir import Columns
from rewrite.ir.stacks import EMPTY

_UNPLACED = -1


@frozen
class Placement:
    """Where every node goes, and an order of the nodes that keeps placed nodes together."""

    stack: np.ndarray
    """The effective stack id of every node (ids of the table; never unknown)."""
    position: np.ndarray | None
    """A topological order (position per node) in which each placed node sits right before
    its first user; None when no node was placed (the graph order)."""


def place_nodes(columns: Columns, table: StackTable) -> Placement:
    """Place the nodes whose stack is unknown (see the module docstring)."""
    sid = columns.stack_id.astype(np.int64)
    sid[columns.is_io] = EMPTY
    is_unknown = table.depth[sid] < 0
    enclosed = enclosed_at_root(columns, table, sid)
    if enclosed.size:
        is_unknown[enclosed] = True
    unknown = np.flatnonzero(is_unknown)
    if unknown.size == 0:
        return Placement(sid, None)

    # the users of each unknown node, grouped by node: user_of[low[k]:high[k]]
    user_of, low, high = columns.users_of(unknown)
    has_users = high > low

    # the common case in one pass: every user is placed already, none is a graph output,
    # and all of them sit in the same stack -> that stack
    user_stack = np.where(is_unknown[user_of] | columns.is_io[user_of], -1, sid[user_of])
    starts = low[has_users]
    lowest = np.full(unknown.size, -1, dtype=np.int64)
    highest = np.full(unknown.size, -2, dtype=np.int64)
    first_user = unknown.copy()
    if starts.size:
        lowest[has_users] = np.minimum.reduceat(user_stack, starts)
        highest[has_users] = np.maximum.reduceat(user_stack, starts)
        first_user[has_users] = np.minimum.reduceat(user_of, starts)
    simple = (lowest >= 0) & (lowest == highest)
    sid[unknown[simple]] = lowest[simple]
    anchor = np.arange(columns.size, dtype=np.int64)  # the first known node each one feeds
    anchor[unknown[simple]] = first_user[simple]

    rest = np.flatnonzero(~simple)
    if rest.size:
        _place_rest(columns, table, sid, unknown, rest, user_of, low, high, anchor)
    # each unknown node moves to just before the first known node it feeds (ties: graph
    # order); a producer always stays before its users, so this is a topological order
    key = np.arange(columns.size, dtype=np.int64) * 2 + 1
    key[unknown] = anchor[unknown] * 2
    position = np.empty(columns.size, dtype=np.int64)
    position[np.argsort(key, kind="stable")] = np.arange(columns.size, dtype=np.int64)
    return Placement(sid, position)


def enclosed_at_root(columns: Columns, table: StackTable, sid: np.ndarray) -> np.ndarray:
    """Nodes recorded at the top level that sit inside one module call: each connected set
    of top-level nodes whose producers and users (graph inputs aside) all lie inside one
    deeper call, with at least one of each and no graph output among the users (a region a
    strict export recorded at the root). Placed like nodes without a stack, they go into that
    call; left at the top level, data would leave the call and come back."""
    is_io = columns.is_io
    root = (sid == EMPTY) & ~is_io
    roots = np.flatnonzero(root)
    if roots.size == 0:
        return roots
    deep = table.depth[sid] >= 1
    start, inputs = columns.input_start, columns.input_index
    # seeds: top-level nodes with a producer inside a call (from the CSR inputs of the
    # top-level nodes alone: the edge list is only made when there is a seed)
    counts = start[roots + 1] - start[roots]
    offsets = np.repeat(start[roots] - np.cumsum(counts) + counts, counts)
    producers = inputs[offsets + np.arange(int(counts.sum()), dtype=np.int64)]
    seeds = np.unique(np.repeat(roots, counts)[deep[producers]])
    if seeds.size == 0:
        return seeds
    producer, consumer = columns.edges()
    by_producer = np.argsort(producer, kind="stable")
    users, user_start = consumer[by_producer], np.searchsorted(producer[by_producer],
                                                               np.arange(columns.size + 1))
    is_root, is_deep, is_out = root.tolist(), deep.tolist(), is_io.tolist()
    stack = sid.tolist()
    seen: set[int] = set()
    found: list[int] = []
    for seed in seeds.tolist():
        if seed in seen:
            continue
        component, todo = [seed], [seed]
        seen.add(seed)
        common, has_input, has_user, ok = -1, False, False, True
        while todo:
            node = todo.pop()
            for k, side in ((inputs[start[node]:start[node + 1]], 0),
                            (users[user_start[node]:user_start[node + 1]], 1)):
                for other in k.tolist():
                    if is_root[other]:
                        if other not in seen:
                            seen.add(other)
                            component.append(other)
                            todo.append(other)
                    elif is_out[other]:
                        ok = ok and side == 0  # a graph input is fine, the output is not
                    elif is_deep[other]:
                        has_input = has_input or side == 0
                        has_user = has_user or side == 1
                        s = stack[other]
                        common = s if common < 0 else table.common_prefix(common, s)
        if ok and has_input and has_user and common >= 0 and table.depth_of(common) >= 1:
            found.extend(component)
    return np.array(sorted(found), dtype=np.int64)


_MOST_ANCESTORS = 8
"""How many stacks of known ancestors a node without a stack remembers (enough for a chain of
such nodes inside one call; a node fed by many calls is placed by its users anyway)."""


def _known_ancestors(unknown: list[int], sid: list[int], start: np.ndarray,
                     inputs: np.ndarray, is_io: np.ndarray) -> dict[int, dict[int, None]]:
    """For each node without a stack (``unknown``, in graph order), the stacks of its nearest
    producers that have one, looking through those without (a residual add fed by a view whose
    metadata was stripped too), nearest first; graph inputs and initializers say nothing. A
    chain of such nodes (the fused residual adds of a whole encoder, read layer after layer)
    keeps its nearest stacks."""
    above: dict[int, dict[int, None]] = {}
    io = is_io.tolist()
    for node in unknown:
        producers = [p for p in inputs[start[node]:start[node + 1]].tolist() if not io[p]]
        found = dict.fromkeys(sid[p] for p in producers if p not in above)
        for p in producers:
            if len(found) >= _MOST_ANCESTORS:
                break
            found.update(above.get(p, {}))
        above[node] = dict.fromkeys(list(found)[:_MOST_ANCESTORS])
    return above


def _place_rest(columns: Columns, table: StackTable, sid: np.ndarray, unknown: np.ndarray,
                rest: np.ndarray, user_of: np.ndarray, low: np.ndarray, high: np.ndarray,
                anchor: np.ndarray) -> None:
    """Place the other unknown nodes one by one, users first (updates ``sid``, ``anchor``)."""
    placed = sid.tolist()
    start, inputs = columns.input_start, columns.input_index
    above = _known_ancestors(unknown.tolist(), placed, start, inputs,  # before any is placed
                             columns.is_io)
    nodes = unknown[rest].tolist()
    for i in nodes:
        placed[i] = _UNPLACED
    anchors = anchor.tolist()
    is_io = columns.is_io
    for k, node in zip(reversed(rest.tolist()), reversed(nodes)):
        found = _UNPLACED
        users = user_of[low[k]:high[k]].tolist()
        anchors[node] = min((anchors[u] for u in users), default=node)
        inside: set[int] = set()  # the stacks of the users that are not graph outputs
        for u in users:
            s = placed[u]
            if s == _UNPLACED:
                continue
            if is_io[u]:
                found = EMPTY
                continue
            inside.add(s)
            found = s if found == _UNPLACED else table.common_prefix(found, s)
        if inside:  # between a producer and a user of a deeper call: inside that call
            deepest = table.depth_of(found)
            for a in above[node]:
                for s in inside:
                    shared = table.common_prefix(a, s)
                    if table.depth_of(shared) > deepest:
                        found, deepest = shared, table.depth_of(shared)
        placed[node] = found

    for i in nodes:
        if placed[i] != _UNPLACED:
            continue
        found = _UNPLACED  # dead code: go with the producers
        for p in inputs[start[i]:start[i + 1]].tolist():
            s = placed[p] if placed[p] != _UNPLACED else EMPTY
            found = s if found == _UNPLACED else table.common_prefix(found, s)
        placed[i] = EMPTY if found == _UNPLACED else found
    sid[unknown[rest]] = [placed[i] for i in nodes]
    anchor[unknown[rest]] = [anchors[i] for i in nodes]
