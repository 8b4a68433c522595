"""Where nodes without a module stack go: with their users.

A node whose stack is unknown (no ``nn_module_stack``: ``get_attr`` constants, nodes a pass or
an optimizer made) takes the longest common prefix of its users' stacks. So a constant used by
one block goes inside that block (and is recomputed in its function), one used by several
blocks stays in their common parent, and one read by the graph output stays at the top level.
Users whose own stack is unknown are placed first (reverse topological order). A node with no
placed user (dead code) takes the common prefix of its producers' stacks, or the top level.
Graph inputs and outputs always stay at the top level.

The work is per unknown node; known nodes only cost an array copy.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from rewrite.grouping.stacks import StackTable
from rewrite.ir import Columns

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
    sid = table.canon[columns.stack_id]
    sid[columns.is_io] = table.empty
    unknown = np.flatnonzero(table.is_unknown()[sid])
    if unknown.size == 0:
        return Placement(sid, None)

    producer, consumer = columns.edges()
    mark = np.zeros(columns.size, dtype=bool)
    mark[unknown] = True
    picked = mark[producer]
    by_producer = np.argsort(producer[picked], kind="stable")
    user_of = consumer[picked][by_producer]
    sorted_producer = producer[picked][by_producer]
    low = np.searchsorted(sorted_producer, unknown, side="left")
    high = np.searchsorted(sorted_producer, unknown, side="right")

    placed = sid.tolist()
    for i in unknown.tolist():
        placed[i] = _UNPLACED
    anchor: dict[int, int] = {}  # unknown node -> index of the first known node it feeds
    is_io = columns.is_io
    empty = table.empty
    for k in range(unknown.size - 1, -1, -1):
        found = _UNPLACED
        users = user_of[low[k]:high[k]].tolist()
        node = int(unknown[k])
        anchor[node] = min((anchor.get(u, u) for u in users), default=node)
        for u in users:
            s = placed[u]
            if s == _UNPLACED:
                continue
            if is_io[u]:
                found = empty
                break
            found = s if found == _UNPLACED else table.common_prefix(found, s)
            if found == empty:
                break
        placed[int(unknown[k])] = found

    start, inputs = columns.input_start, columns.input_index
    for i in unknown.tolist():
        if placed[i] != _UNPLACED:
            continue
        found = _UNPLACED  # dead code: go with the producers
        for p in inputs[start[i]:start[i + 1]].tolist():
            s = placed[p] if placed[p] != _UNPLACED else empty
            found = s if found == _UNPLACED else table.common_prefix(found, s)
        placed[i] = empty if found == _UNPLACED else found
    # each unknown node moves to just before the first known node it feeds (ties: graph
    # order); a producer always stays before its users, so this is a topological order
    key = np.arange(columns.size, dtype=np.int64) * 2 + 1
    moved = np.fromiter(anchor.keys(), dtype=np.int64, count=len(anchor))
    key[moved] = np.fromiter(anchor.values(), dtype=np.int64, count=len(anchor)) * 2
    position = np.empty(columns.size, dtype=np.int64)
    position[np.argsort(key, kind="stable")] = np.arange(columns.size, dtype=np.int64)
    return Placement(np.asarray(placed, dtype=np.int64), position)
