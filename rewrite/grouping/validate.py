"""Check that every group can be outlined: no cycle between siblings at any level.

Collapse each group into one node, level by level: the graph of a group's direct members
(its loose nodes and child groups) must stay acyclic. This is exactly the condition for
outlining all groups bottom-up; it rules out non-convex groups (data leaving a group and
coming back in through nodes outside it).

Fast path: in a topological order of the nodes, if every group's nodes form one contiguous
range, the members of each level are disjoint ranges and every edge goes from an earlier
range to a later one, so no cycle is possible. The check order is the graph's, with each node
placement moved next to its first user (still topological; see ``placement``). That costs a
few array passes. Only the levels holding a non-contiguous child are searched for a cycle,
and only within the window of positions those children span (a cycle through a group never
leaves the window between its first and last node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from attrs import frozen

from rewrite.ir import Columns

if TYPE_CHECKING:
    from rewrite.grouping.tree import GroupTable

Path = tuple[int, ...]


@frozen
class Cycle:
    """Members of one level that form a cycle, and one node edge per step of it."""

    parent: Path
    groups: tuple[int, ...]
    """The group segments on the cycle (children of ``parent``), non-contiguous ones first."""
    edges: tuple[tuple[int, int], ...]
    """(producer, consumer) node indices, one per step of the cycle."""


@frozen
class Spans:
    """Per path id: nodes in the group and its descendants, first and last position."""

    count: np.ndarray
    first: np.ndarray
    last: np.ndarray
    position: np.ndarray | None = None
    """Position of each node in the check order (None: the graph order)."""

    def scattered(self) -> np.ndarray:
        """Path ids of the non-empty groups whose nodes are not one contiguous range."""
        bad = (self.count > 0) & (self.last - self.first + 1 != self.count)
        bad[0] = False  # the root
        return np.flatnonzero(bad)


def group_spans(pid: np.ndarray, parent: np.ndarray, depth: np.ndarray,
                position: np.ndarray | None = None) -> Spans:
    """Count, first and last position of every group (path 0 is the root, ``parent[p]`` is
    the id of the path without its last segment, ``depth[p]`` its length)."""
    size, count_paths = len(pid), len(parent)
    count = np.bincount(pid, minlength=count_paths).astype(np.int64)
    order = position if position is not None else np.arange(size, dtype=np.int64)
    first = np.full(count_paths, size, dtype=np.int64)
    last = np.full(count_paths, -1, dtype=np.int64)
    np.minimum.at(first, pid, order)
    np.maximum.at(last, pid, order)
    for d in range(int(depth.max()) if len(depth) else 0, 0, -1):  # children into parents
        level = np.flatnonzero(depth == d)
        up = parent[level]
        np.add.at(count, up, count[level])
        np.minimum.at(first, up, first[level])
        np.maximum.at(last, up, last[level])
    return Spans(count, first, last, position)


def find_cycle(columns: Columns, pid: np.ndarray, groups: "GroupTable", spans: Spans
               ) -> Cycle | None:
    """The first cycle found between the members of some group, or None."""
    scattered = spans.scattered().tolist()
    if not scattered:
        return None
    paths = [groups.path(k) for k in range(len(groups))]  # only on this slow path
    by_parent: dict[Path, list[int]] = {}
    for p in scattered:
        by_parent.setdefault(paths[p][:-1], []).append(p)
    below: dict[Path, list[int]] = {}  # parent -> ids of the paths under it
    for k, p in enumerate(paths):
        for depth in range(len(p) + 1):
            if p[:depth] in by_parent:
                below.setdefault(p[:depth], []).append(k)
    size = columns.size
    position = spans.position
    if position is None:
        position = np.arange(size, dtype=np.int64)
        node_at = position
    else:
        node_at = np.empty(size, dtype=np.int64)
        node_at[position] = np.arange(size, dtype=np.int64)
    for level, children in by_parent.items():
        lo = int(spans.first[children].min())
        hi = int(spans.last[children].max())
        cycle = _level_cycle(columns, pid, paths, below[level], level, lo, hi, position,
                             node_at, {paths[c][-1] for c in children})
        if cycle is not None:
            return cycle
    return None


def _level_cycle(columns: Columns, pid: np.ndarray, paths: Sequence[Path], below: list[int],
                 level: Path, lo: int, hi: int, position: np.ndarray, node_at: np.ndarray,
                 scattered: set[int]) -> Cycle | None:
    depth = len(level)
    # member of each path at this level: a child segment id, -1 loose, -2 not under it
    segments: dict[int, int] = {}
    member_of_path = np.full(len(paths), -2, dtype=np.int64)
    for k in below:
        p = paths[k]
        member_of_path[k] = segments.setdefault(p[depth], len(segments)) if len(p) > depth else -1
    window = node_at[lo:hi + 1]  # the nodes, in check order
    member = member_of_path[pid[window]]
    loose = member == -1
    member[loose] = len(segments) + window[loose]  # each loose node is a member of its own

    start, inputs = columns.input_start, columns.input_index
    counts = start[window + 1] - start[window]
    total = int(counts.sum())
    consumer = np.repeat(window, counts)
    producer = (inputs[np.repeat(start[window] - np.cumsum(counts) + counts, counts)
                       + np.arange(total)] if total else np.zeros(0, np.int64))
    where = position[producer]
    keep = (where >= lo) & (where <= hi)
    producer, consumer = producer[keep], consumer[keep]
    a = member[position[producer] - lo]
    b = member[position[consumer] - lo]
    keep = (a >= 0) & (b >= 0) & (a != b)
    producer, consumer, a, b = producer[keep], consumer[keep], a[keep], b[keep]

    adjacency: dict[int, set[int]] = {}
    witness: dict[tuple[int, int], tuple[int, int]] = {}
    for x, y, u, v in zip(a.tolist(), b.tolist(), producer.tolist(), consumer.tolist()):
        if (x, y) not in witness:
            witness[(x, y)] = (u, v)
            adjacency.setdefault(x, set()).add(y)
    found = _cycle(adjacency)
    if found is None:
        return None
    names = {i: s for s, i in segments.items()}
    groups = [names[m] for m in found if m in names]
    groups.sort(key=lambda g: g not in scattered)
    steps = tuple(witness[(x, y)] for x, y in zip(found, found[1:] + found[:1]))
    return Cycle(level, tuple(groups), steps)


def _cycle(adjacency: dict[int, set[int]]) -> list[int] | None:
    """A cycle in a directed graph, by iterative DFS; None if acyclic."""
    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[int, int] = {}
    for start in list(adjacency):
        if color.get(start, WHITE) != WHITE:
            continue
        stack = [(start, iter(adjacency.get(start, ())))]
        trail = [start]
        color[start] = GREY
        while stack:
            vertex, it = stack[-1]
            advanced = False
            for nxt in it:
                state = color.get(nxt, WHITE)
                if state == GREY:
                    return trail[trail.index(nxt):]
                if state == WHITE:
                    color[nxt] = GREY
                    stack.append((nxt, iter(adjacency.get(nxt, ()))))
                    trail.append(nxt)
                    advanced = True
                    break
            if not advanced:
                color[vertex] = BLACK
                stack.pop()
                trail.pop()
    return None
