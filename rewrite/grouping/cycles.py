"""Groups that cannot be outlined: the error, or (``on cycle flatten``) the flattened group.

A cycle found by ``validate`` names the groups on it; the first is one whose nodes are not
contiguous, the one that data leaves and comes back to. Under the ``error`` policy that is a
:class:`GroupingError` naming its rule; under ``flatten`` the group is dissolved (its nodes and
child groups go to its parent), a warning says why, and grouping checks again.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from rewrite.compile import Rule, Split
from rewrite.errors import Diagnostic, GroupingError
from rewrite.grouping.tree import GroupTable, Segments
from rewrite.grouping.validate import Cycle
from rewrite.ir import Graph, ModuleCall


@frozen
class Flattened:
    """A group dissolved by ``on cycle flatten``: what it was, where its nodes went, and why."""

    id: str
    """The group's id when it was found (``model/model.layers.0``)."""
    call: ModuleCall
    """The module call it stood for."""
    rule: Rule | Split | None
    """The rule that made it."""
    into: str
    """The id of the group that took its nodes (``""``: the top level)."""
    reason: str
    """Why it could not be outlined."""
    nodes: tuple[str, ...]
    """The nodes on the cycle (one edge per step)."""

    @property
    def origin(self) -> str | None:
        return self.rule.origin if self.rule is not None else None


def cycle_nodes(graph: Graph, cycle: Cycle) -> tuple[str, ...]:
    """The names of the nodes on the cycle's edges, each once, in order."""
    nodes = graph.nodes
    names: list[str] = []
    for edge in cycle.edges:
        for i in edge:
            if nodes[i].name not in names:
                names.append(nodes[i].name)
    return tuple(names)


def _where(segments: Segments, cycle: Cycle) -> str:
    return segments.display(cycle.parent) or "the top level"


def _reason(segments: Segments, cycle: Cycle) -> str:
    first, *others = (segments.key(g) for g in cycle.groups)
    through = f" through {', '.join(others)}" if others else ""
    return (f"group {first} cannot be outlined: data leaves it and comes back in through other "
            f"nodes of {_where(segments, cycle)} (a cycle{through})")


def raise_cycle(graph: Graph, segments: Segments, cycle: Cycle) -> None:
    """The error for a cycle under the ``error`` policy."""
    names = cycle_nodes(graph, cycle)
    if not cycle.groups:  # pragma: no cover - a cycle between loose nodes is not a graph
        raise GroupingError(f"cycle between nodes in {_where(segments, cycle)}", nodes=names)
    rule = segments.rule(cycle.groups[0])
    raise GroupingError(
        f"{_reason(segments, cycle)}; flatten it, or group the nodes in between with it "
        "(or write 'on cycle flatten')",
        rule=rule.origin if rule is not None else None,
        nodes=names,
    )


def flattenable(cycle: Cycle) -> bool:
    """Whether the cycle's first group is a module group (split components stay errors)."""
    return bool(cycle.groups) and cycle.groups[0] >= 0


def flatten_group(graph: Graph, segments: Segments, table: GroupTable, parent: np.ndarray,
                  group_of: np.ndarray, cycle: Cycle) -> Flattened:
    """Dissolve the cycle's first group into its parent: updates ``parent`` and ``group_of``
    in place (the group keeps its id but holds nothing). A child that lands beside a group of
    the same call (only malformed module stacks nest a call in two places) merges into it: one
    group per path, as grouping made them."""
    path = cycle.parent + (cycle.groups[0],)
    k = next(g for g in range(1, len(table)) if table.count[g] and table.path(g) == path)
    up = int(parent[k])
    ids = [segments.display(table.path(g)) for g in (k, up)]
    group_of[group_of == k] = up
    moved = np.flatnonzero(parent == k).tolist()
    parent[moved] = up
    gone = {k}
    for child in moved:
        _merge_with_namesake(table, parent, group_of, child, gone)
    return Flattened(ids[0], segments.calls[cycle.groups[0]], segments.rule(cycle.groups[0]),
                     ids[1], _reason(segments, cycle), cycle_nodes(graph, cycle))


def _merge_with_namesake(table: GroupTable, parent: np.ndarray, group_of: np.ndarray,
                         group: int, gone: set[int]) -> None:
    """If a sibling of ``group`` stands for the same segment, move ``group``'s nodes and
    children into it (children meeting a namesake there merge too)."""
    up, segment = int(parent[group]), int(table.segment[group])
    for other in np.flatnonzero((parent == up) & (table.segment == segment)).tolist():
        if other != group and other not in gone and table.count[other]:
            gone.add(group)
            group_of[group_of == group] = other
            moved = np.flatnonzero(parent == group).tolist()
            parent[moved] = other
            for child in moved:
                _merge_with_namesake(table, parent, group_of, child, gone)
            return


def flattened_warning(flat: Flattened) -> Diagnostic:
    """The warning for one flattened group: the reason, where its nodes went, the nodes."""
    into = f"group {flat.into}" if flat.into else "the top level"
    shown = ", ".join(flat.nodes[:8]) + (f", ... ({len(flat.nodes)} in all)"
                                         if len(flat.nodes) > 8 else "")
    span = flat.rule.span if flat.rule is not None else None
    return Diagnostic("warning", f"{flat.reason}; flattened it (on cycle flatten): its nodes "
                      f"go to {into}", span, f"nodes involved: {shown}")
