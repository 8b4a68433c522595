"""A columnar view of a :class:`~rewrite.ir.graph.Graph` for whole-graph passes.

Graphs repeat a few distinct module stacks, op targets and tag sets over many nodes. The
columns intern each of them once and give every node small integer ids, plus the edges as a
CSR array, so that grouping runs its per-node work as numpy array operations and its
per-*distinct-value* work in Python. Frontends fill them while they read a model (stacks
and calls through :class:`~rewrite.ir.stacks.StackTreeBuilder`, then
:func:`~rewrite.ir.stacks.build_columns`); :func:`~rewrite.ir.stacks.columns_of` derives them
from the nodes of any graph. Every field is always filled.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
from attrs import field, frozen

if TYPE_CHECKING:
    from rewrite.ir.model import Stack

EMPTY_TAGS: Mapping[str, str] = MappingProxyType({})
"""The tag set of an untagged node (shared, read-only)."""


def frozen_array(values: Sequence[int] | np.ndarray, dtype=np.int32) -> np.ndarray:
    """``values`` as a read-only numpy array (the columns are shared, never written)."""
    array = np.asarray(values, dtype=dtype)
    array.flags.writeable = False
    return array


@frozen
class Columns:
    """Per-node ids into tables of distinct values, and the input edges."""

    stacks: Sequence["Stack | None"] = field(repr=False)
    """Distinct module stacks (``None``: unknown); ``stack_id[i]`` indexes it. Made on first
    access from the tree below (:class:`~rewrite.ir.stacks.StackSequence`); ids
    :data:`~rewrite.ir.stacks.EMPTY` (0) and :data:`~rewrite.ir.stacks.UNKNOWN` (1) are
    fixed."""
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
    stack_calls: Sequence[tuple[int, ...] | None] = field(repr=False)
    """Each stack as call ids, indices into ``Graph.calls`` (``None`` for the unknown stack),
    made on first access."""
    stack_parent: np.ndarray = field(repr=False)
    """Per stack, the id of the stack without its last call (-1: the empty and unknown
    stacks). Complete: every other stack's parent is a stack, one call shorter."""
    stack_last: np.ndarray = field(repr=False)
    """Per stack, its last call id (-1: the empty and unknown stacks)."""
    stack_depth: np.ndarray = field(repr=False)
    """Per stack, its number of calls (0: empty, -1: unknown)."""
    call_columns: "CallColumns" = field(repr=False)
    """The graph's calls (``Graph.calls``) as columns."""
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
    path_id: np.ndarray = field(repr=False)
    """Per call, the id of its path in ``distinct_paths``."""
    distinct_paths: Mapping[str, int] = field(repr=False)
    """Each distinct path and its id, in id order. With ``path_id``, a path pattern
    without wildcards is one dict lookup and one array comparison, not a look at every call's
    string (which, at a million nodes, is mostly cache misses)."""

    def __len__(self) -> int:
        return len(self.paths)


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
