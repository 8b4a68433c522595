"""The split action: one top-level component per value of a tag.

``split by KEY`` cuts the graph into components, one per value of tag ``KEY`` (tags from
``annotate``, ``node.tag`` or tag rules), named after the value:

* order: as the rule lists the values (``order "encode", "decode"``), else by first
  appearance in the graph (topological order);
* nodes without the tag go with their users (the earliest component among them), else with
  their producers (the latest), like nodes without a stack; graph inputs and outputs stay at
  the top level;
* data must flow from earlier components to later ones. With an explicit order, a node that
  reads from a later component is an error naming both nodes. Without an order, when a
  value's region comes back after another (A, B, A) so that one component per value would
  form a cycle, each contiguous run becomes its own component: ``A``, ``B``, ``A_1``
  (``split_by_tags`` fails there); a suffix that names another value's component is
  skipped (with a value ``A_1`` too: ``A``, ``B``, ``A_2``, ``A_1``);
* with an explicit order, a tagged node whose value the order does not list is an error.

Module groups nest inside components: a module call cut by the split becomes one group per
component it has nodes in.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from attrs import frozen

from rewrite.compile import Split
from rewrite.errors import GroupingError
from rewrite.ir import Columns, Graph


@frozen
class Component:
    name: str
    value: str


def _place_untagged(columns: Columns, comp: np.ndarray) -> np.ndarray:
    """Untagged nodes join their earliest user's component, else their latest producer's."""
    is_io = columns.is_io
    todo = np.flatnonzero((comp < 0) & ~is_io)
    if todo.size == 0:
        return comp
    comp = comp.copy()
    # the common case in one pass: every user has a component already -> the earliest
    user_of, low, high = columns.users_of(todo)
    has_users = high > low
    settled = np.zeros(todo.size, dtype=bool)
    if has_users.any():
        user_comp = np.where(is_io[user_of], -1, comp[user_of])
        lowest = np.minimum.reduceat(user_comp, low[has_users])
        settled[has_users] = lowest >= 0
        comp[todo[settled]] = lowest[settled[has_users]]
    rest = np.flatnonzero(~settled)
    if rest.size == 0:
        return comp
    out = comp.tolist()
    io = is_io.tolist()
    nodes = todo[rest].tolist()
    for k, i in zip(reversed(rest.tolist()), reversed(nodes)):
        best = -1
        for u in user_of[low[k]:high[k]].tolist():
            c = out[u]
            if c >= 0 and not io[u] and (best < 0 or c < best):
                best = c
        out[i] = best
    in_start, inputs = columns.input_start, columns.input_index
    for i in nodes:
        if out[i] < 0:
            best = -1
            for p in inputs[in_start[i]:in_start[i + 1]].tolist():
                if out[p] > best:
                    best = out[p]
            out[i] = best
    comp[todo[rest]] = [out[i] for i in nodes]
    return comp


def _backward_edge(columns: Columns, comp: np.ndarray) -> tuple[int, int] | None:
    producer, consumer = columns.edges()
    cp, cc = comp[producer], comp[consumer]
    bad = np.flatnonzero((cp >= 0) & (cc >= 0) & (cp > cc))
    if bad.size == 0:
        return None
    return int(producer[bad[0]]), int(consumer[bad[0]])


def split_components(
    graph: Graph, tags_id: np.ndarray, tag_sets: Sequence[Mapping[str, str]], split: Split
) -> tuple[list[Component], np.ndarray]:
    """The components in order and, per node, its component index (-1: top level)."""
    columns = graph.columns
    key = split.key
    set_values = [t.get(key) for t in tag_sets]
    names = sorted({v for v in set_values if v is not None})
    value_of_set = np.array([-1 if v is None else names.index(v) for v in set_values],
                            dtype=np.int64)
    value = value_of_set[tags_id] if len(tag_sets) else np.full(columns.size, -1)
    value[columns.is_io] = -1
    tagged = np.flatnonzero(value >= 0)
    if tagged.size == 0:
        raise GroupingError(f"no node has the tag {key!r} to split by", rule=split.origin)
    if split.order:
        unlisted = [i for i, v in enumerate(names) if v not in split.order]
        if unlisted:
            node = graph.nodes[int(np.flatnonzero(np.isin(value, unlisted))[0])]
            raise GroupingError(
                f"node {node.name} has {key} = {names[int(value[node.index])]!r}, which the "
                f"split order does not list ({', '.join(map(repr, split.order))})",
                rule=split.origin,
                nodes=(node.name,),
            )
        values = list(split.order)
    else:
        first = [int(np.argmax(value == v)) for v in range(len(names))]  # few values
        values = [names[v] for v in sorted(range(len(names)), key=first.__getitem__)]
    rank = np.array([values.index(n) if n in values else -1 for n in names], dtype=np.int64)
    comp = np.where(value >= 0, rank[np.maximum(value, 0)], -1)
    comp = _place_untagged(columns, comp)
    bad = _backward_edge(columns, comp)
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
    return _split_runs(columns, value, names)


def _split_runs(columns: Columns, value: np.ndarray, names: list[str]
                ) -> tuple[list[Component], np.ndarray]:
    """One component per contiguous run of a value, in topological order."""
    tagged = np.flatnonzero(value >= 0)
    values = value[tagged]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    runs = [names[v] for v in values[starts].tolist()]
    components = [Component(name, run) for name, run in zip(_run_names(runs), runs)]
    comp = np.full(columns.size, -1, dtype=np.int64)
    run = np.zeros(len(values), dtype=np.int64)
    run[starts[1:]] = 1
    comp[tagged] = np.cumsum(run)
    return components, _place_untagged(columns, comp)


def _run_names(runs: list[str]) -> list[str]:
    """A unique name per run (``runs``: the value of each): a value's first run is named
    after it, its later runs ``value_1``, ``value_2``..., skipping a name that another value
    or an earlier run has."""
    taken = set(runs)
    suffix: dict[str, int] = {}
    out = []
    for value in runs:
        if value not in suffix:
            suffix[value] = 1
            out.append(value)
            continue
        n = suffix[value]
        while f"{value}_{n}" in taken:
            n += 1
        suffix[value] = n + 1
        taken.add(f"{value}_{n}")
        out.append(f"{value}_{n}")
    return out
