"""The tree of distinct module stacks: the one builder every frontend fills.

A graph repeats a few module stacks over many nodes. :class:`StackTreeBuilder` numbers each
distinct stack once, as it comes, and records it as a tree: stack ``k`` is stack
``parent[k]`` plus call ``last[k]`` and holds ``depth[k]`` calls. Two ids are fixed:

* :data:`EMPTY` (0): the empty stack, the top level (depth 0);
* :data:`UNKNOWN` (1): a node whose stack is not known (depth -1; grouping places it).

Both have parent and last -1. The tree is always complete: every other stack's parent is in
it, one call shorter. Calls are numbered as they come too (ids into ``Graph.calls``, outer
calls first) and kept as :class:`~rewrite.ir.columns.CallColumns`. The tuples of the stacks
are made only when asked for (:class:`StackSequence`): a million-node graph has ~300k distinct
stacks, and grouping reads the tree as arrays.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from rewrite.ir.columns import CallColumns, Columns, Interner, TagSets, frozen_array
from rewrite.ir.model import ModuleCall, Node, Stack

EMPTY = 0
"""The id of the empty stack (the top level) in every graph."""
UNKNOWN = 1
"""The id of the unknown stack in every graph."""

_UNSEEN = object()


class StackSequence(Sequence):
    """Stacks given as a tree, each made a tuple on first access (then kept).

    Stack ``k`` is stack ``parent[k]`` plus call ``last[k]``; ``depth[k]`` is its number of
    calls (0: the empty stack, -1: unknown, ``None``). The items are call ids, or with
    ``calls`` the calls themselves. The lists are read live: a frontend may append to them
    while it reads a graph.
    """

    __slots__ = ("_parent", "_last", "_depth", "_calls", "_made")

    def __init__(self, parent: Sequence[int], last: Sequence[int], depth: Sequence[int],
                 calls: Sequence | None = None) -> None:
        self._parent, self._last, self._depth, self._calls = parent, last, depth, calls
        self._made: dict[int, tuple | None] = {}

    def keep(self, k: int, stack: tuple) -> None:
        """Remember the tuple of stack ``k`` when the caller has it already."""
        self._made[k] = stack

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


class StackTreeBuilder:
    """Numbers distinct calls and stacks as a frontend meets them (see the module docstring).

    ``calls``: calls numbered first, in this order (a graph's ``Graph.calls``).
    """

    __slots__ = ("parent", "last", "depth", "calls", "stacks", "stack_calls", "_call_ids",
                 "_paths", "_path_ids", "_path_id", "_class_ids", "_class_id", "_index",
                 "_ends_stack", "_pairs", "_by_stack")

    def __init__(self, calls: Iterable[ModuleCall] = ()) -> None:
        self.parent: list[int] = [-1, -1]
        """Per stack, the stack without its last call (-1 for the empty and unknown ones)."""
        self.last: list[int] = [-1, -1]
        """Per stack, its last call id (-1 for the empty and unknown ones)."""
        self.depth: list[int] = [0, -1]
        """Per stack, its number of calls (-1 for the unknown one)."""
        self.calls: list[ModuleCall] = []
        """Per call id, the call."""
        self.stacks = StackSequence(self.parent, self.last, self.depth, self.calls)
        """Per stack id, its tuple of calls (None: unknown), made on first access."""
        self.stack_calls = StackSequence(self.parent, self.last, self.depth)
        """Per stack id, its tuple of call ids, made on first access."""
        self._call_ids: dict[tuple[str, str, int], int] = {}
        self._paths: list[str] = []
        self._path_ids: dict[str, int] = {}
        self._path_id: list[int] = []
        self._class_ids: dict[str, int] = {}
        self._class_id: list[int] = []
        self._index: list[int] = []
        self._ends_stack: list[bool] = []  # per call: some stack ends with it already
        self._pairs: dict[tuple[int, int], int] | None = None  # (parent, last) -> stack
        self._by_stack: dict = {(): EMPTY, None: UNKNOWN}  # for intern()
        for call in calls:
            self.add_call(call)

    def __len__(self) -> int:
        return len(self.parent)

    # --- calls -----------------------------------------------------------------------------

    def call(self, path: str, cls: str, index: int = 0) -> int:
        """The id of the call ``(path, cls, index)`` (numbered if new)."""
        key = (path, cls, index)
        found = self._call_ids.get(key)
        return self._new_call(key, ModuleCall(path, cls, index)) if found is None else found

    def add_call(self, call: ModuleCall) -> int:
        """The id of ``call`` (numbered if new, keeping this object)."""
        key = (call.path, call.cls, call.index)
        found = self._call_ids.get(key)
        return self._new_call(key, call) if found is None else found

    def _new_call(self, key: tuple[str, str, int], call: ModuleCall) -> int:
        found = self._call_ids[key] = len(self.calls)
        self.calls.append(call)
        self._paths.append(call.path)
        self._path_id.append(self._path_ids.setdefault(call.path, len(self._path_ids)))
        self._class_id.append(self._class_ids.setdefault(call.cls, len(self._class_ids)))
        self._index.append(call.index)
        self._ends_stack.append(False)
        return found

    # --- stacks ----------------------------------------------------------------------------

    def child(self, parent: int, call: int) -> int:
        """The id of stack ``parent`` plus call id ``call`` (added if new). A call below the
        unknown stack is read as below the top level (its stack is known from there)."""
        if parent == UNKNOWN:
            parent = EMPTY
        if self._ends_stack[call]:  # uncommon: look the pair up (index made on first need)
            pairs = self._pairs
            if pairs is None:
                pairs = self._pairs = {(p, c): k for k, (p, c) in
                                       enumerate(zip(self.parent, self.last)) if c >= 0}
            found = pairs.get((parent, call))
            if found is not None:
                return found
        else:
            self._ends_stack[call] = True
        found = len(self.parent)
        self.parent.append(parent)
        self.last.append(call)
        self.depth.append(self.depth[parent] + 1)
        if self._pairs is not None:
            self._pairs[(parent, call)] = found
        return found

    def intern(self, stack: Stack | None) -> int:
        """The id of a stack given as a tuple of calls (None: unknown); parents first."""
        found = self._by_stack.get(stack)
        if found is None:
            assert stack is not None
            parent = self.intern(stack[:-1])
            found = self._by_stack[stack] = self.child(parent, self.add_call(stack[-1]))
            self.stacks.keep(found, stack)
        return found

    def ids(self, stacks: Iterable[Stack | None]) -> list[int]:
        """Per item, the id of its stack (:meth:`intern`); the work is per change of stack
        object (consecutive nodes mostly share one)."""
        out: list[int] = []
        last: object = _UNSEEN
        last_id = -1
        intern = self.intern
        for stack in stacks:
            if stack is not last:
                last, last_id = stack, intern(stack)
            out.append(last_id)
        return out

    def call_columns(self) -> CallColumns:
        """The calls as columns."""
        return CallColumns(tuple(self._paths), tuple(self._class_ids),
                           frozen_array(self._class_id, np.int64),
                           frozen_array(self._index, np.int64),
                           frozen_array(self._path_id, np.int64), self._path_ids)


def build_columns(
    tree: "StackTreeBuilder", stack_id: Sequence[int], targets: Sequence[str],
    target_id: Sequence[int], tag_sets: Sequence[Mapping[str, str]], tags_id: Sequence[int],
    is_io: Sequence[bool], input_start: Sequence[int], input_index: Sequence[int],
) -> Columns:
    """Freeze what a frontend collected (the stacks and calls in ``tree``) into
    :class:`Columns`."""
    wide = np.int64
    columns = Columns(
        tree.stacks, frozen_array(stack_id), tuple(targets), frozen_array(target_id),
        tuple(tag_sets), frozen_array(tags_id), frozen_array(is_io, bool),
        frozen_array(input_start, wide), frozen_array(input_index, wide), tree.stack_calls,
        frozen_array(tree.parent, wide), frozen_array(tree.last, wide),
        frozen_array(tree.depth, wide), tree.call_columns(),
    )
    columns.edges()  # part of the IR: every whole-graph pass reads them
    return columns


def columns_of(nodes: Sequence["Node"], calls: Sequence["ModuleCall"] | None = None
               ) -> Columns:
    """Columns derived from nodes (for graphs whose frontend did not build them). ``calls``
    (a graph's ``Graph.calls``) keep their ids and must hold every call of the stacks;
    without them, calls are numbered in order of first appearance."""
    tree = StackTreeBuilder(calls or ())
    stack_id = tree.ids([node.stack for node in nodes])
    if calls is not None and len(tree.calls) != len(calls):
        raise ValueError(f"a node's stack holds the call {tree.calls[len(calls)]}, which "
                         "the graph's calls do not list")
    targets, tag_sets = Interner(), TagSets()
    target_id, tags_id, is_io, start, flat = [], [], [], [0], []
    for node in nodes:
        target_id.append(targets.id(node.target))
        tags_id.append(tag_sets.id(node.tags))
        is_io.append(node.is_io)
        flat.extend(node.inputs)
        start.append(len(flat))
    return build_columns(tree, stack_id, targets.values, target_id, tag_sets.values, tags_id,
                         is_io, start, flat)
