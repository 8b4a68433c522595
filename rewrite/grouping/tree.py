r"""The result of grouping: a tree of groups over the nodes of one graph.

Grouping decides everything as columns (:class:`GroupTable`: per group its parent, what it
stands for, its size; per node the group that holds it). A group *is* its integer id in that
table (``Group.index``; 0 is the root): backends read the table and the ids. The
:class:`Group` records, their display ids and the per-node views (:attr:`GroupTree.owner`,
:attr:`GroupTree.tags`) are built from the columns on first use, once, like the graph's
``Node`` records: a caller that only needs the decisions does not pay for a million small
objects.

Display ids (``Group.id``, ``explain --json``) are the keys of a group's path joined by ``/``
(``h.0/h.0.attn``), with ``/`` and ``\`` inside a key escaped by a ``\`` (a split tag value
``enc/x`` is ``enc\/x``, its member ``a`` is ``enc\/x/a``): one group, one id. They are for
people and files; code that walks the tree uses ``Group.index`` and the table.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
from attrs import field, frozen

from rewrite.compile import Rule, Split
from rewrite.compile.templates import Renderer
from rewrite.grouping.decide import Decisions
from rewrite.grouping.measures import CallMeasures, Measures
from rewrite.grouping.split import Component
from rewrite.ir import Graph, ModuleCall

SPLIT_DOMAIN = "pkg.rewrite"
"""The domain of split components' functions."""


@frozen
class Group:
    """A set of nodes that becomes one ONNX function / one FX submodule."""

    id: str
    """Display id, unique in the tree: the escaped keys from the root joined by ``/``
    (``h.0/h.0.attn``; see the module docstring)."""
    kind: str
    """``root``, ``module`` (one module call) or ``component`` (one split component)."""
    call: ModuleCall | None
    """The module call, for module groups."""
    rule: Rule | Split | None = field(eq=False)
    """The rule that made the group (None for the root)."""
    function_name: str
    """Function / submodule name from the rule's template (``GPT2Block``, ``encode``)."""
    domain: str
    children: tuple["Group", ...] = field(repr=False)
    nodes: tuple[int, ...] = field(repr=False)
    """Indices of the nodes directly in this group (not in a child), in topological order."""
    size: int
    """Number of nodes in the group and all its descendants."""
    tag_value: str | None = None
    """The tag value of a split component."""
    key: str = field(kw_only=True)
    """What the group stands for under its parent: the call key (``h.0``, ``shared@1``) or
    the component name (``""`` for the root)."""
    index: int = field(kw_only=True, eq=False, repr=False)
    """The group's id in :attr:`GroupTree.table` (0: the root)."""

    @property
    def origin(self) -> str | None:
        """``file:line`` of the rule that made the group."""
        return self.rule.origin if self.rule is not None else None

    def walk(self) -> Iterator["Group"]:
        """This group and its descendants, parents before children."""
        yield self
        for child in self.children:
            yield from child.walk()

    def all_nodes(self) -> list[int]:
        """Every node in the group or a descendant, in topological order."""
        out = list(self.nodes)
        for child in self.children:
            out.extend(child.all_nodes())
        out.sort()
        return out


def _escaped(key: str) -> str:
    if "/" not in key and "\\" not in key:
        return key
    return key.replace("\\", "\\\\").replace("/", "\\/")


@frozen
class Segments:
    """What the last segment of a group's path stands for: a module call (id >= 0) or a
    split component (``-1 - k`` for component ``k``)."""

    calls: Sequence[ModuleCall] = field(repr=False)
    decisions: Decisions = field(repr=False)
    components: tuple[Component, ...] = ()
    split: Split | None = None

    def key(self, segment: int) -> str:
        if segment >= 0:
            return self.calls[segment].key
        return self.components[-1 - segment].name

    def display(self, path: Iterable[int]) -> str:
        """The display id of a path of segments (:meth:`GroupTable.path`; ``""``: the root)."""
        return "/".join([_escaped(self.key(segment)) for segment in path])

    def rule(self, segment: int) -> Rule | Split | None:
        if segment >= 0:
            return self.decisions.rule_of(segment)
        return self.split


@frozen(eq=False)
class GroupTable:
    """Every group of a tree as columns. Group 0 is the root; parents have smaller ids."""

    parent: np.ndarray
    """Per group, its parent group (-1 for the root)."""
    segment: np.ndarray
    """Per group, its last path segment (see :class:`Segments`; unused for the root)."""
    depth: np.ndarray
    """Per group, its nesting depth (0 for the root)."""
    count: np.ndarray
    """Per group, the number of nodes in it and its descendants (0: an empty path)."""
    first: np.ndarray
    """Per group, the position of its first node in a topological order."""

    def __len__(self) -> int:
        return len(self.parent)

    def path(self, group: int) -> tuple[int, ...]:
        """The segments from the root down to ``group``."""
        out = []
        while group > 0:
            out.append(int(self.segment[group]))
            group = int(self.parent[group])
        return tuple(reversed(out))


@frozen
class SubtreeShape:
    """Where a group's nodes sit in its subtree (:meth:`GroupTree.subtree_shape`)."""

    placed: tuple[int, ...]
    """Per node (in the order given), the number of its group."""
    groups: tuple[tuple, ...]
    """Per number: ``(parent's number, kind, function name, domain)`` (``""``: the top)."""
    ids: tuple[int, ...] = field(eq=False)
    """Per number, the group's id in the tree (not part of the shape)."""


@frozen(eq=False)
class GroupTree:
    """Groups of one graph plus what a backend needs to lower them."""

    graph: Graph = field(repr=False)
    table: GroupTable = field(repr=False)
    segments: Segments = field(repr=False)
    group_of: np.ndarray = field(repr=False)
    """For each node, the id (in :attr:`table`) of the innermost group that holds it."""
    tags_id: np.ndarray = field(repr=False)
    """For each node, the index of its tags (after tag rules) in :attr:`tag_sets`."""
    tag_sets: tuple[Mapping[str, str], ...] = field(repr=False)
    warnings: tuple = ()
    """Diagnostics such as rules that matched nothing."""
    flattened: tuple = ()
    """The groups dissolved by ``on cycle flatten`` (``cycles.Flattened``), in order."""
    call_measures: CallMeasures | None = field(default=None, repr=False)
    """What ``size``, ``depth``, ``repeats`` and ``call`` selectors compare, per call."""
    _made: dict = field(factory=dict, init=False, repr=False)

    def measures(self, group: Group) -> Measures | None:
        """The measures of a module group's call (None for components and the root)."""
        if group.call is None or self.call_measures is None:
            return None
        if "call_ids" not in self._made:
            self._made["call_ids"] = {c: i for i, c in enumerate(self.segments.calls)}
        return self.call_measures.of(self._made["call_ids"][group.call])

    @property
    def root(self) -> Group:
        """The root group (the records are built on first use)."""
        return self.records[0]  # type: ignore[return-value]

    @property
    def records(self) -> Sequence[Group | None]:
        """Per group id (:attr:`table`), its record; None for a group that holds no node."""
        if "records" not in self._made:
            self._made["records"] = _records(self)
        return self._made["records"]

    @property
    def owner(self) -> tuple[str, ...]:
        """For each node, the id of the innermost group that holds it (``""``: the root)."""
        if "owner" not in self._made:
            names = np.empty(len(self.table), dtype=object)
            names[:] = self.ids
            self._made["owner"] = tuple(names[self.group_of].tolist())
        return self._made["owner"]

    @property
    def tags(self) -> tuple[Mapping[str, str], ...]:
        """For each node, its tags after tag rules."""
        if "tags" not in self._made:
            sets = np.empty(len(self.tag_sets), dtype=object)
            sets[:] = list(self.tag_sets)
            self._made["tags"] = tuple(sets[self.tags_id].tolist())
        return self._made["tags"]

    def subtree_shape(self, group: int, nodes: Sequence[int]) -> SubtreeShape:
        """How the nodes ``nodes`` (all inside group ``group``) sit in its subtree, with the
        subtree's groups numbered in order of first node: two subtrees with equal shapes give
        one function. ``group`` is number 0."""
        records, parent = self.records, self.table.parent
        local: dict[int, int] = {group: 0}
        ordered = [group]
        top = records[group]
        shape: list[tuple] = [("", top.kind, top.function_name, top.domain)]

        def number(g: int) -> int:
            found = local.get(g)
            if found is None:
                up = number(int(parent[g]))
                record = records[g]
                found = local[g] = len(shape)
                ordered.append(g)
                shape.append((up, record.kind, record.function_name, record.domain))
            return found

        placed = tuple([number(g) for g in self.group_of[np.asarray(nodes, dtype=np.int64)]
                        .tolist()])
        return SubtreeShape(placed, tuple(shape), tuple(ordered))

    def groups(self) -> Iterator[Group]:
        """Every group but the root, parents before children."""
        for child in self.root.children:
            yield from child.walk()

    def find(self, group_id: str) -> Group | None:
        for group in self.root.walk():
            if group.id == group_id:
                return group
        return None

    @property
    def ids(self) -> Sequence[str]:
        """Per group id (:attr:`table`), its display id (``""`` for the root); each is made
        from its parent's (parents come first)."""
        if "ids" not in self._made:
            key = self.segments.key
            names = [""] * len(self.table)
            for k, (parent, segment) in enumerate(zip(self.table.parent.tolist(),
                                                      self.table.segment.tolist())):
                if k:
                    above, own = names[parent], _escaped(key(segment))
                    names[k] = f"{above}/{own}" if above else own
            self._made["ids"] = names
        return self._made["ids"]


def _records(tree: GroupTree) -> list[Group | None]:
    """The records: children in order of their first node (split components in their
    order), each group's direct nodes in graph order. Bottom-up, one pass."""
    table, names = tree.table, tree.ids
    size = len(table)
    order = np.argsort(tree.group_of, kind="stable").tolist()
    bounds = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(tree.group_of, minlength=size), out=bounds[1:])
    bounds = bounds.tolist()
    count, first = table.count.tolist(), table.first.tolist()
    segments = table.segment.tolist()
    children: dict[int, list[int]] = {}
    for k, parent in enumerate(table.parent.tolist()):
        if k and count[k]:
            children.setdefault(parent, []).append(k)

    def rank(g: int) -> tuple[int, int]:
        return (0, -segments[g]) if segments[g] < 0 else (1, first[g])

    segs = tree.segments
    calls, split, components = segs.calls, segs.split, segs.components
    rule_of, render = segs.decisions.rule_of, Renderer()
    made: list[Group | None] = [None] * size
    for k in np.argsort(-table.depth, kind="stable").tolist():
        if not k or not count[k]:
            continue
        kids_ids = children.get(k, ())
        if len(kids_ids) > 1:
            kids_ids.sort(key=rank)
        kids = tuple([made[g] for g in kids_ids])
        own = tuple(order[bounds[k]:bounds[k + 1]])
        segment = segments[k]
        if segment >= 0:
            call, rule = calls[segment], rule_of(segment)
            assert rule is not None
            made[k] = Group(names[k], "module", call, rule,
                            render(rule.name_template, call),
                            render(rule.domain_template, call), kids, own, count[k],
                            key=call.key, index=k)
        else:
            component = components[-1 - segment]
            made[k] = Group(names[k], "component", None, split, component.name,
                            SPLIT_DOMAIN, kids, own, count[k], tag_value=component.value,
                            key=component.name, index=k)
    top = children.get(0, [])
    top.sort(key=rank)
    kids = tuple([made[g] for g in top])
    own = tuple(order[bounds[0]:bounds[1]])
    made[0] = Group("", "root", None, None, tree.graph.root_class or "main", "", kids, own,
                    len(own) + sum(kid.size for kid in kids), key="", index=0)
    return made
