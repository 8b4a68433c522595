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

from rewrite.ir import Columns, ModuleCall, Stack
from rewrite.ir.columns import CallColumns, call_columns_of


class StackTable:
    """Stacks by id (``None``: unknown), each as a tuple of indices into :attr:`calls`.

    ``parent``, ``last`` and ``depth`` (arrays per stack id; -1 for none) describe the tree;
    they cover the stacks present when :meth:`tree` is first called (after placement, which
    may add common prefixes).
    """

    def __init__(self, columns: Columns, calls: Sequence[ModuleCall]) -> None:
        self.calls: list[ModuleCall] = list(calls)
        self._call_id: dict[ModuleCall, int] | None = None
        self._prefix: dict[tuple[int, int], int] = {}
        self._by_ids: dict[tuple[int, ...] | None, int] | None = None
        self._given: Columns | None = None
        self.parent_list: list[int] | None = None  # made when stacks are added
        if columns.stack_calls is not None:  # the frontend numbered the calls already
            # (a sequence that may make its tuples on demand: read only when needed)
            self.ids: Sequence[tuple[int, ...] | None] = columns.stack_calls
            self.canon = np.arange(len(self.ids), dtype=np.int64)
            if (columns.stack_parent is not None and columns.stack_last is not None
                    and columns.stack_depth is not None):
                self._given = columns  # the whole tree of stacks, as arrays
        else:
            self.ids, self.parent_list = [], []
            self.canon = np.asarray([self.add(self._to_ids(s)) for s in columns.stacks],
                                    dtype=np.int64)
        given_depth = self._given_depth()
        if given_depth is not None:
            empty = np.flatnonzero(given_depth == 0)
            self.empty = int(empty[0]) if empty.size else self.add(())
        else:
            try:
                self.empty = list(self.ids).index(())
            except ValueError:
                self.empty = self.add(())
        self._columns: dict[str, object] = {}
        self._call_columns = columns.call_columns
        self._tree: tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]] | None = None

    def _to_ids(self, stack: Stack | None) -> tuple[int, ...] | None:
        if stack is None:
            return None
        if self._call_id is None:
            self._call_id = {c: i for i, c in enumerate(self.calls)}
        out = []
        for call in stack:
            i = self._call_id.get(call)
            if i is None:  # a call the frontend did not list
                i = self._call_id[call] = len(self.calls)
                self.calls.append(call)
            out.append(i)
        return tuple(out)

    def add(self, ids: tuple[int, ...] | None) -> int:
        """The id of the stack with these call ids (added if new)."""
        if self._by_ids is None:
            self._by_ids = {}
            for k, existing in enumerate(self.ids):
                self._by_ids.setdefault(existing, k)
        found = self._by_ids.get(ids)
        if found is None:
            parents = self._parents()
            if not isinstance(self.ids, list):
                self.ids = list(self.ids)
            found = self._by_ids[ids] = len(self.ids)
            self.ids.append(ids)
            parents.append(-1)
            self._tree = None
        return found

    def _parents(self) -> list[int]:
        """The parent of each stack as a list that can grow (-1: not known yet)."""
        if self.parent_list is None:
            given = self._given.stack_parent if self._given is not None else None
            self.parent_list = given.tolist() if given is not None else [-1] * len(self.ids)
        return self.parent_list

    def __len__(self) -> int:
        return len(self.ids)

    def _given_depth(self) -> np.ndarray | None:
        """The frontend's depth per stack, while its tree covers every stack of the table."""
        given = self._given
        if given is None or given.stack_depth is None or len(given.stack_depth) != len(self.ids):
            return None
        return given.stack_depth

    def is_unknown(self) -> np.ndarray:
        """Bool per stack id: the stack is unknown (one id at most)."""
        given_depth = self._given_depth()
        if given_depth is not None:
            return given_depth < 0
        out = np.zeros(len(self.ids), dtype=bool)
        try:
            out[list(self.ids).index(None)] = True
        except ValueError:
            pass
        return out

    def depths(self) -> np.ndarray:
        """Per stack id, its number of calls (-1 for the unknown stack)."""
        given_depth = self._given_depth()
        if given_depth is not None:
            return np.asarray(given_depth, dtype=np.int64)
        return np.array([-1 if c is None else len(c) for c in self.ids], dtype=np.int64)

    def depth_of(self, stack: int) -> int:
        """The number of calls of a known stack (-1 for the unknown one)."""
        given_depth = self._given_depth()
        if given_depth is not None:
            return int(given_depth[stack])
        calls = self.ids[stack]
        return -1 if calls is None else len(calls)

    def common_prefix(self, a: int, b: int) -> int:
        """The id of the longest common prefix of two known stacks."""
        if a == b:
            return a
        key = (a, b) if a < b else (b, a)
        found = self._prefix.get(key)
        if found is None:
            x, y = self.ids[a], self.ids[b]
            assert x is not None and y is not None
            n = min(len(x), len(y))
            i = 0
            while i < n and x[i] == y[i]:
                i += 1
            found = self._prefix[key] = self.add(x[:i])
        return found

    # --- the tree of stacks -------------------------------------------------------------------

    def tree(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        """``(parent, last, depth, levels)``: per stack id its parent stack and last call
        (-1: none), its number of calls (-1: unknown), and the stack ids of each depth
        ``1, 2, ...`` (every known non-empty stack's parent is in the table)."""
        if self._tree is None:
            self._tree = self._make_tree()
        return self._tree

    def _make_tree(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        ids, given, given_depth = self.ids, self._given, self._given_depth()
        if given is not None and given_depth is not None:
            assert given.stack_last is not None
            depth, last = given_depth, given.stack_last
            parent = np.array(given.stack_parent, dtype=np.int64)
        else:
            depth = np.fromiter((-1 if s is None else len(s) for s in ids), dtype=np.int64,
                                count=len(ids))
            last = np.fromiter((s[-1] if s else -1 for s in ids), dtype=np.int64,
                               count=len(ids))
            parent = np.asarray(self._parents(), dtype=np.int64)
        # a given parent must have exactly one call less; else (or if none was given) find it
        ok = (parent >= 0) & (depth > 0)
        ok[ok] = depth[parent[ok]] == depth[ok] - 1
        missing = np.flatnonzero(~ok & (depth > 0))
        if missing.size:
            parents = self._parents()
            self._given = None
            for s in missing.tolist():
                stack = ids[s]
                assert stack is not None
                parents[s] = self.add(stack[:-1])
            if len(self.ids) > len(depth):  # added prefixes: they may lack parents too
                return self._make_tree()
            parent = np.asarray(self._parents(), dtype=np.int64)
        parent[depth <= 0] = -1
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(1, int(depth.max(initial=0)) + 2))
        levels = [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]
        return parent, last, depth, levels

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
    def call_columns(self) -> CallColumns:
        """The calls as columns (the frontend's, or derived from :attr:`calls`)."""
        if self._call_columns is None or len(self._call_columns) != len(self.calls):
            self._call_columns = call_columns_of(self.calls)
        return self._call_columns

    @property
    def paths(self) -> Sequence[str]:
        return self.call_columns.paths

    @property
    def indices(self) -> tuple[list[str], np.ndarray]:
        """Distinct call indices as text, and per call the position of its index."""
        found = self._columns.get("indices")
        if found is None:
            distinct, inverse = np.unique(self.call_columns.index, return_inverse=True)
            found = self._columns["indices"] = ([str(n) for n in distinct.tolist()],
                                                inverse.reshape(-1))
        return found  # type: ignore[return-value]

    @property
    def class_ids(self) -> tuple[Sequence[str], np.ndarray]:
        """Distinct qualified class names, and per call the index of its class."""
        columns = self.call_columns
        return columns.classes, columns.class_id
