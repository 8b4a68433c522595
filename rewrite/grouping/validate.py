"""Check that every group can be outlined: no cycle between siblings at any level.

Collapse each group into one node, level by level: the graph of a group's direct members
(its loose nodes and child groups) must stay acyclic. This is exactly the condition for
outlining all groups bottom-up; it also rules out non-convex groups (data leaving a group and
coming back). Each edge is looked at once, at the level where the two ends' group paths part.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable

from rewrite.ir import Graph

Path = tuple[Hashable, ...]
Member = Hashable


def _member(path: Path, depth: int, node: int) -> Member:
    return path[depth] if len(path) > depth else ("node", node)


def find_cycle(graph: Graph, paths: list[Path]) -> tuple[Path, list[Member], list[tuple[int, int]]] | None:
    """The first cycle found: (parent path, members on the cycle, crossing node edges)."""
    edges: dict[Path, dict[Member, set[Member]]] = defaultdict(lambda: defaultdict(set))
    witness: dict[tuple[Path, Member, Member], tuple[int, int]] = {}
    for node in graph.nodes:
        pv = paths[node.index]
        for u in node.inputs:
            pu = paths[u]
            if pu is pv:
                continue
            n = min(len(pu), len(pv))
            d = 0
            while d < n and pu[d] == pv[d]:
                d += 1
            if d == len(pu) and d == len(pv):
                continue
            a, b = _member(pu, d, u), _member(pv, d, node.index)
            parent = pv[:d]
            if b not in edges[parent][a]:
                edges[parent][a].add(b)
                witness[(parent, a, b)] = (u, node.index)
    for parent, adjacency in edges.items():
        cycle = _cycle(adjacency)
        if cycle:
            crossing = [witness[(parent, a, b)] for a, b in zip(cycle, cycle[1:] + cycle[:1])]
            return parent, cycle, crossing
    return None


def _cycle(adjacency: dict[Member, set[Member]]) -> list[Member] | None:
    """A cycle in a small directed graph, by iterative DFS; None if acyclic."""
    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[Member, int] = defaultdict(int)
    for start in list(adjacency):
        if color[start] != WHITE:
            continue
        stack = [(start, iter(adjacency.get(start, ())))]
        trail = [start]
        color[start] = GREY
        while stack:
            vertex, it = stack[-1]
            advanced = False
            for nxt in it:
                if color[nxt] == GREY:
                    return trail[trail.index(nxt):]
                if color[nxt] == WHITE:
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
