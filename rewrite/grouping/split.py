"""The split action: one top-level component per value of a tag.

Components are ordered as the rule lists them, or by first appearance in the graph. Nodes
without the tag go with their users (else their producers), like nodes without a stack; graph
inputs and outputs stay at the top level. Data must flow from earlier components to later
ones: with an explicit order a contradiction is an error naming the nodes. Without an order,
when a value's region appears twice with another in between (A, B, A) so that one component per
value would form a cycle, each contiguous run becomes its own component: ``A``, ``B``, ``A_1``
(``split_by_tags`` fails there).
"""

from __future__ import annotations

from typing import Mapping

from attrs import frozen

from rewrite.compile import Split
from rewrite.errors import GroupingError
from rewrite.ir import Graph


@frozen
class Component:
    name: str
    value: str


def _place_untagged(graph: Graph, users: list[list[int]], raw: list[int | None]) -> list[int | None]:
    nodes = graph.nodes
    for i in range(len(nodes) - 1, -1, -1):
        if raw[i] is None and not nodes[i].is_io:
            candidates = [raw[u] for u in users[i] if raw[u] is not None and not nodes[u].is_io]
            if candidates:
                raw[i] = min(candidates)
    for node in nodes:
        if raw[node.index] is None and not node.is_io:
            candidates = [raw[p] for p in node.inputs if raw[p] is not None]
            if candidates:
                raw[node.index] = max(candidates)
    return raw


def _backward_edge(graph: Graph, comp: list[int | None]) -> tuple[int, int] | None:
    for node in graph.nodes:
        c = comp[node.index]
        if c is None:
            continue
        for p in node.inputs:
            cp = comp[p]
            if cp is not None and cp > c:
                return p, node.index
    return None


def split_components(
    graph: Graph, tags: list[Mapping[str, str]], users: list[list[int]], split: Split
) -> tuple[list[Component], list[int | None]]:
    """The components in order and, per node, its component index (None: top level)."""
    key = split.key
    values: list[str] = list(split.order)
    index = {v: i for i, v in enumerate(values)}
    raw: list[int | None] = [None] * len(graph.nodes)
    for node in graph.nodes:
        if node.is_io:
            continue
        value = tags[node.index].get(key)
        if value is None:
            continue
        if value not in index:
            if split.order:
                raise GroupingError(
                    f"node {node.name} has {key} = {value!r}, which the split order does not list "
                    f"({', '.join(map(repr, split.order))})",
                    rule=split.origin,
                    nodes=(node.name,),
                )
            index[value] = len(values)
            values.append(value)
        raw[node.index] = index[value]
    if not values:
        raise GroupingError(f"no node has the tag {key!r} to split by", rule=split.origin)
    comp = _place_untagged(graph, users, list(raw))
    bad = _backward_edge(graph, comp)
    if bad is None:
        return [Component(v, v) for v in values], comp
    if split.order:
        producer, consumer = (graph.nodes[i] for i in bad)
        raise GroupingError(
            f"the split order contradicts the data flow: {consumer.name} ({key} = "
            f"{values[comp[consumer.index]]!r}) reads {producer.name} ({key} = "
            f"{values[comp[producer.index]]!r}), which comes later in the order",
            rule=split.origin,
            nodes=(producer.name, consumer.name),
        )
    return _split_runs(graph, tags, users, key)


def _split_runs(
    graph: Graph, tags: list[Mapping[str, str]], users: list[list[int]], key: str
) -> tuple[list[Component], list[int | None]]:
    """One component per contiguous run of a value, in topological order."""
    components: list[Component] = []
    seen: dict[str, int] = {}
    raw: list[int | None] = [None] * len(graph.nodes)
    current: str | None = None
    for node in graph.nodes:
        if node.is_io:
            continue
        value = tags[node.index].get(key)
        if value is None:
            continue
        if value != current:
            n = seen.get(value, 0)
            seen[value] = n + 1
            components.append(Component(value if n == 0 else f"{value}_{n}", value))
            current = value
        raw[node.index] = len(components) - 1
    comp = _place_untagged(graph, users, raw)
    return components, comp
