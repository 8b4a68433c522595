"""The distinct module stacks of a graph as a tree of stack ids, with per-call columns.

Grouping works on stack ids: every per-node question (where does this node go, which groups
hold it) is answered once per distinct stack and then looked up for each node by id. Stacks
form a tree: each known stack but the empty one is its *parent* stack (one call shorter) plus
its *last* call. Questions about all the calls of a stack (does any call of it match? which
calls hold a node?) are answered level by level over that tree, as numpy array passes. The
table also keeps, for selectors, the calls' paths, indices and classes as flat columns.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rewrite.ir import Columns, ModuleCall
from rewrite.ir.columns import CallColumns


class StackTable:
    """The graph's tree of stacks (``Columns.stack_parent``, ``stack_last``, ``stack_depth``:
    complete, as every frontend builds it) and its calls, with what grouping asks of them.

    Stack ids are the columns' (:data:`~rewrite.ir.stacks.EMPTY` the top level, a depth of
    -1 the unknown stack); call ids index :attr:`calls`. ``parent``, ``last``, ``depth``:
    arrays per stack id.
    """

    def __init__(self, columns: Columns, calls: Sequence[ModuleCall]) -> None:
        self.calls: Sequence[ModuleCall] = calls
        self.call_columns: CallColumns = columns.call_columns
        self.parent: np.ndarray = columns.stack_parent
        self.last: np.ndarray = columns.stack_last
        self.depth: np.ndarray = columns.stack_depth
        self._levels: list[np.ndarray] | None = None
        self._lists: tuple[list[int], list[int]] | None = None
        self._prefix: dict[tuple[int, int], int] = {}
        self._indices: tuple[list[str], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.parent)

    def _as_lists(self) -> tuple[list[int], list[int]]:
        """``parent`` and ``depth`` as lists, for the one-at-a-time questions below."""
        if self._lists is None:
            self._lists = (self.parent.tolist(), self.depth.tolist())
        return self._lists

    def depth_of(self, stack: int) -> int:
        """The number of calls of a stack (-1 for the unknown one)."""
        return self._as_lists()[1][stack]

    def common_prefix(self, a: int, b: int) -> int:
        """The id of the longest common prefix of two known stacks (up the tree)."""
        if a == b:
            return a
        key = (a, b) if a < b else (b, a)
        found = self._prefix.get(key)
        if found is None:
            parent, depth = self._as_lists()
            assert depth[a] >= 0 and depth[b] >= 0
            x, y = a, b
            while depth[x] > depth[y]:
                x = parent[x]
            while depth[y] > depth[x]:
                y = parent[y]
            while x != y:
                x, y = parent[x], parent[y]
            found = self._prefix[key] = x
        return found

    # --- the tree of stacks -------------------------------------------------------------------

    def tree(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        """``(parent, last, depth, levels)``: per stack id its parent stack and last call
        (-1: none), its number of calls (-1: unknown), and the stack ids of each depth
        ``1, 2, ...``."""
        if self._levels is None:
            depth = self.depth
            order = np.argsort(depth, kind="stable")
            bounds = np.searchsorted(depth[order],
                                     np.arange(1, int(depth.max(initial=0)) + 2))
            self._levels = [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]
        return self.parent, self.last, self.depth, self._levels

    def any_call(self, call_mask: np.ndarray) -> np.ndarray:
        """Per stack id: some call of the stack is set in ``call_mask`` (per call id)."""
        parent, last, _, levels = self.tree()
        out = np.zeros(len(parent), dtype=bool)
        for level in levels:
            out[level] = out[parent[level]] | call_mask[last[level]]
        return out

    def calls_in(self, stack_mask: np.ndarray) -> np.ndarray:
        """Per call id: the call is in some stack set in ``stack_mask`` (per stack id)."""
        parent, last, _, levels = self.tree()
        marked = np.zeros(len(parent), dtype=bool)
        marked[:len(stack_mask)] = stack_mask
        out = np.zeros(len(self.calls), dtype=bool)
        for level in reversed(levels):
            hit = level[marked[level]]
            out[last[hit]] = True
            marked[parent[hit]] = True
        return out

    # --- per-call columns for selectors ------------------------------------------------------

    @property
    def indices(self) -> tuple[list[str], np.ndarray]:
        """Distinct call indices as text, and per call the position of its index."""
        if self._indices is None:
            distinct, inverse = np.unique(self.call_columns.index, return_inverse=True)
            self._indices = ([str(n) for n in distinct.tolist()], inverse.reshape(-1))
        return self._indices

    @property
    def class_ids(self) -> tuple[Sequence[str], np.ndarray]:
        """Distinct qualified class names, and per call the index of its class."""
        columns = self.call_columns
        return columns.classes, columns.class_id
