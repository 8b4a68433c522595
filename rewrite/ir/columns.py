"""A columnar view of a :class:`~rewrite.ir.model.Graph` for whole-graph passes.

Graphs repeat a few distinct module stacks, op targets and tag sets over many nodes. The
columns intern each of them once and give every node small integer ids, plus the edges as a
CSR array, so that grouping runs its per-node work as numpy array operations and its
per-*distinct-value* work in Python. Frontends fill them while they read a model
(:class:`ColumnsBuilder`); :func:`columns_of` derives them from the nodes of any graph.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
from attrs import field, frozen

if TYPE_CHECKING:
    from rewrite.ir.model import ModuleCall, Node, Stack

EMPTY_TAGS: Mapping[str, str] = MappingProxyType({})
"""The tag set of an untagged node (shared, read-only)."""


def _array(values: Sequence[int] | np.ndarray, dtype=np.int32) -> np.ndarray:
    array = np.asarray(values, dtype=dtype)
    array.flags.writeable = False
    return array


@frozen
class Columns:
    """Per-node ids into tables of distinct values, and the input edges."""

    stacks: Sequence["Stack | None"] = field(repr=False)
    """Distinct module stacks (``None``: unknown); ``stack_id[i]`` indexes it. A tuple, or a
    :class:`StackSequence` that builds each stack's tuple on first access."""
    stack_id: np.ndarray = field(repr=False)
    targets: tuple[str, ...] = field(repr=False)
    """Distinct op targets; ``target_id[i]`` indexes it."""
    target_id: np.ndarray = field(repr=False)
    tag_sets: tuple[Mapping[str, str], ...] = field(repr=False)
    """Distinct tag sets; ``tags_id[i]`` indexes it."""
    tags_id: np.ndarray = field(repr=False)
    is_io: np.ndarray = field(repr=False)
    """Bool per node: graph inputs and outputs."""
    input_start: np.ndarray = field(repr=False)
    """Node ``i`` reads ``input_index[input_start[i]:input_start[i + 1]]``."""
    input_index: np.ndarray = field(repr=False)
    stack_calls: Sequence[tuple[int, ...] | None] | None = field(default=None, repr=False)
    """Optional: each stack as indices into ``Graph.calls`` (``None`` for the unknown stack)."""
    stack_parent: np.ndarray | None = field(default=None, repr=False)
    """Optional: per stack, the id of the stack without its last call (-1: none known)."""
    stack_last: np.ndarray | None = field(default=None, repr=False)
    """Optional, with ``stack_calls``: per stack, its last call id (-1: empty or unknown)."""
    stack_depth: np.ndarray | None = field(default=None, repr=False)
    """Optional, with ``stack_calls``: per stack, its number of calls (-1: unknown)."""
    call_columns: "CallColumns | None" = field(default=None, repr=False)
    """Optional: the graph's calls (``Graph.calls``) as columns."""
    _edges: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, eq=False,
                                                         repr=False)

    @property
    def size(self) -> int:
        return len(self.stack_id)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(producer, consumer)`` arrays, one entry per input edge (made once, read-only)."""
        if self._edges is None:
            counts = np.diff(self.input_start)
            consumer = np.repeat(np.arange(self.size, dtype=np.int64), counts)
            consumer.flags.writeable = False
            object.__setattr__(self, "_edges",
                               (self.input_index.astype(np.int64, copy=False), consumer))
        return self._edges  # type: ignore[return-value]

    def users_of(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(users, low, high)``: the users of ``nodes[k]`` (sorted, distinct node indices)
        are ``users[low[k]:high[k]]``, in graph order; consecutive nodes' users are
        contiguous, so ``np.ufunc.reduceat`` over ``low`` of the nodes with users works."""
        producer, consumer = self.edges()
        mark = np.zeros(self.size, dtype=bool)
        mark[nodes] = True
        picked = mark[producer]
        by_producer = np.argsort(producer[picked], kind="stable")
        users = consumer[picked][by_producer]
        sorted_producer = producer[picked][by_producer]
        return (users, np.searchsorted(sorted_producer, nodes, side="left"),
                np.searchsorted(sorted_producer, nodes, side="right"))


class Interner:
    """Gives each distinct hashable value a small id (first come, first numbered)."""

    __slots__ = ("values", "_ids")

    def __init__(self, values: Iterable = ()) -> None:
        self.values: list = []
        self._ids: dict = {}
        for value in values:
            self.id(value)

    def id(self, value) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def __len__(self) -> int:
        return len(self.values)


@frozen
class CallColumns:
    """The module calls of a graph (``Graph.calls``) as columns, for selectors that ask
    about every call at once."""

    paths: tuple[str, ...] = field(repr=False)
    classes: tuple[str, ...] = field(repr=False)
    """Distinct qualified class names; ``class_id[c]`` indexes it."""
    class_id: np.ndarray = field(repr=False)
    index: np.ndarray = field(repr=False)
    """Per call, its call index (``N`` of ``path@N``)."""
    path_id: np.ndarray | None = field(default=None, repr=False)
    """Optional, with ``distinct_paths``: per call, the id of its path."""
    distinct_paths: Mapping[str, int] | None = field(default=None, repr=False)
    """Optional: each distinct path and its id, in id order. With ``path_id``, a path pattern
    without wildcards is one dict lookup and one array comparison, not a look at every call's
    string (which, at a million nodes, is mostly cache misses)."""

    def __len__(self) -> int:
        return len(self.paths)


class CallColumnsBuilder:
    """Collects :class:`CallColumns` as a frontend meets the calls, in call id order."""

    __slots__ = ("paths", "classes", "class_id", "index", "distinct_paths", "path_id")

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.classes = Interner()
        self.class_id: list[int] = []
        self.index: list[int] = []
        self.distinct_paths: dict[str, int] = {}
        self.path_id: list[int] = []

    def add(self, path: str, cls: str, index: int) -> None:
        self.paths.append(path)
        self.class_id.append(self.classes.id(cls))
        self.index.append(index)
        distinct = self.distinct_paths
        self.path_id.append(distinct.setdefault(path, len(distinct)))

    def build(self) -> CallColumns:
        return CallColumns(tuple(self.paths), tuple(self.classes.values),
                           _array(self.class_id, np.int64), _array(self.index, np.int64),
                           _array(self.path_id, np.int64), self.distinct_paths)


def call_columns_of(calls: Sequence["ModuleCall"]) -> CallColumns:
    """Call columns derived from the calls (for frontends that did not collect them)."""
    builder = CallColumnsBuilder()
    for call in calls:
        builder.add(call.path, call.cls, call.index)
    return builder.build()


class StackSequence(Sequence):
    """Stacks given as a tree, each made a tuple on first access (then kept).

    Stack ``k`` is stack ``parent[k]`` plus call ``last[k]``; ``depth[k]`` is its number of
    calls (0: the empty stack, -1: unknown, ``None``). The items are call ids, or with
    ``calls`` the calls themselves. The lists are read live: a frontend may append to them
    while it reads a graph. A million-node graph has one distinct stack per few nodes, and
    most are never looked at as tuples (grouping reads the tree as arrays): making them on
    demand saves their time and the garbage collector's.
    """

    __slots__ = ("_parent", "_last", "_depth", "_calls", "_made")

    def __init__(self, parent: Sequence[int], last: Sequence[int], depth: Sequence[int],
                 calls: Sequence | None = None) -> None:
        self._parent, self._last, self._depth, self._calls = parent, last, depth, calls
        self._made: dict[int, tuple | None] = {}

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return tuple(self[i] for i in range(*k.indices(len(self))))
        if k < 0:
            k += len(self)
        made = self._made
        found = made.get(k, made)
        if found is not made:
            return found
        depth = self._depth[k]
        if depth <= 0:
            found = made[k] = None if depth < 0 else ()
            return found
        chain = []  # up to the nearest stack made already (or the top)
        at = k
        while at not in made and self._depth[at] > 0:
            chain.append(at)
            at = self._parent[at]
        above = made.get(at, ())
        calls, last = self._calls, self._last
        for at in reversed(chain):
            call = last[at] if calls is None else calls[last[at]]
            above = made[at] = (above or ()) + (call,)
        return above

    def __iter__(self):
        return (self[k] for k in range(len(self)))


class StackInterner:
    """Distinct stacks numbered as they come, each with its call ids, parent stack id, last
    call id and depth (the number of calls; -1 for the unknown stack)."""

    __slots__ = ("stacks", "calls", "parents", "lasts", "depths", "_ids")

    def __init__(self) -> None:
        self.stacks: list = []
        self.calls: list[tuple[int, ...] | None] = []
        self.parents: list[int] = []
        self.lasts: list[int] = []
        self.depths: list[int] = []
        self._ids: dict[tuple[int, ...] | None, int] = {}

    def id(self, calls: tuple[int, ...] | None, stack, parent: int = -1) -> int:
        """The id of the stack whose call ids are ``calls`` (added with ``stack`` if new)."""
        found = self._ids.get(calls)
        if found is None:
            found = self._ids[calls] = len(self.stacks)
            self.stacks.append(stack)
            self.calls.append(calls)
            self.parents.append(parent)
            self.lasts.append(calls[-1] if calls else -1)
            self.depths.append(-1 if calls is None else len(calls))
        return found

    def get(self, calls: tuple[int, ...] | None) -> int | None:
        return self._ids.get(calls)


def tags_key(tags: Mapping[str, str]) -> tuple:
    """A hashable key of a tag set (order-insensitive)."""
    return tuple(sorted(tags.items()))


class TagSets:
    """Interns tag sets by content, handing out shared read-only mappings.

    Starts empty but for the empty set (id 0), or from ``initial`` (a graph's tag sets, ids
    kept: grouping grows them as tag rules add tags)."""

    __slots__ = ("values", "_ids", "_empty")

    def __init__(self, initial: Sequence[Mapping[str, str]] | None = None) -> None:
        self.values: list[Mapping[str, str]] = [EMPTY_TAGS] if initial is None else []
        self._ids: dict[tuple, int] = {(): 0} if initial is None else {}
        for tags in initial or ():
            self._ids.setdefault(tags_key(tags), len(self.values))
            self.values.append(tags)
        self._empty: int | None = self._ids.get(())
        """The id of the empty set, if there is one yet (untagged nodes are most)."""

    def id(self, tags: Mapping[str, str]) -> int:
        if not tags and self._empty is not None:
            return self._empty
        key = tags_key(tags)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.values)
            self.values.append(MappingProxyType(dict(key)))
            if not key:
                self._empty = found
        return found

    def get(self, tags: Mapping[str, str]) -> Mapping[str, str]:
        """The shared mapping equal to ``tags``."""
        return self.values[self.id(tags)]


def build_columns(
    stacks: Sequence, stack_id: Sequence[int], targets: Sequence[str], target_id: Sequence[int],
    tag_sets: Sequence[Mapping[str, str]], tags_id: Sequence[int], is_io: Sequence[bool],
    input_start: Sequence[int], input_index: Sequence[int],
    stack_calls: Sequence[tuple[int, ...] | None] | None = None,
    stack_parent: Sequence[int] | None = None, *,
    stack_last: Sequence[int] | None = None, stack_depth: Sequence[int] | None = None,
    call_columns: CallColumns | None = None,
) -> Columns:
    """Freeze the lists a frontend collected into :class:`Columns`."""
    def optional(values: Sequence[int] | None) -> np.ndarray | None:
        return _array(values, np.int64) if values is not None else None

    def frozen(values: Sequence) -> Sequence:
        return values if isinstance(values, StackSequence) else tuple(values)

    columns = Columns(
        frozen(stacks), _array(stack_id), tuple(targets), _array(target_id), tuple(tag_sets),
        _array(tags_id), _array(is_io, bool), _array(input_start, np.int64),
        _array(input_index, np.int64),
        frozen(stack_calls) if stack_calls is not None else None,
        optional(stack_parent), optional(stack_last), optional(stack_depth), call_columns,
    )
    columns.edges()  # part of the IR: every whole-graph pass reads them
    return columns


def columns_of(nodes: Sequence["Node"]) -> Columns:
    """Columns derived from nodes (for graphs whose frontend did not build them)."""
    stacks, targets, tag_sets = Interner(), Interner(), TagSets()
    stack_id, target_id, tags_id, is_io, start, flat = [], [], [], [], [0], []
    for node in nodes:
        stack_id.append(stacks.id(node.stack))
        target_id.append(targets.id(node.target))
        tags_id.append(tag_sets.id(node.tags))
        is_io.append(node.is_io)
        flat.extend(node.inputs)
        start.append(len(flat))
    return build_columns(stacks.values, stack_id, targets.values, target_id, tag_sets.values,
                         tags_id, is_io, start, flat)
