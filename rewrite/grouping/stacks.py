"""The distinct module stacks of a graph, as tuples of call ids, with memoized prefixes.

Grouping works on stack ids: every per-node question (where does this node go, which groups
hold it) is answered once per distinct stack and then looked up for each node by id. The
table also keeps, for questions asked about every call (selectors), the calls' paths and
classes and the stack -> calls relation as flat arrays.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

from rewrite.ir import Columns, ModuleCall, Stack


class StackTable:
    """Stacks by id (``None``: unknown), each as a tuple of indices into :attr:`calls`."""

    def __init__(self, columns: Columns, calls: Sequence[ModuleCall]) -> None:
        self.calls: list[ModuleCall] = list(calls)
        self._call_id: dict[ModuleCall, int] | None = None
        self._prefix: dict[tuple[int, int], int] = {}
        self._by_ids: dict[tuple[int, ...] | None, int] | None = None
        if columns.stack_calls is not None:  # the frontend numbered the calls already
            self.ids: list[tuple[int, ...] | None] = list(columns.stack_calls)
            self.canon = np.arange(len(self.ids), dtype=np.int64)
            parents = columns.stack_parent
            self.parent: list[int] = parents.tolist() if parents is not None else [-1] * len(
                self.ids)
        else:
            self.ids, self.parent = [], []
            self.canon = np.asarray([self.add(self._to_ids(s)) for s in columns.stacks],
                                    dtype=np.int64)
        try:
            self.empty = self.ids.index(())
        except ValueError:
            self.empty = self.add(())
        self._columns: dict[str, object] = {}

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
            found = self._by_ids[ids] = len(self.ids)
            self.ids.append(ids)
            self.parent.append(-1)
        return found

    def __len__(self) -> int:
        return len(self.ids)

    def is_unknown(self) -> np.ndarray:
        """Bool per stack id: the stack is unknown."""
        out = np.zeros(len(self.ids), dtype=bool)
        out[[i for i, s in enumerate(self.ids) if s is None]] = True
        return out

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

    # --- per-call columns for selectors (built on first use) ---------------------------------

    def _cached(self, name: str, make):
        found = self._columns.get(name)
        if found is None:
            found = self._columns[name] = make()
        return found

    @property
    def paths(self) -> list[str]:
        return self._cached("paths", lambda: [c.path for c in self.calls])

    @property
    def indices(self) -> tuple[list[str], np.ndarray]:
        """Distinct call indices as text, and per call the position of its index."""
        def make():
            raw = [c.index for c in self.calls]
            index = {n: i for i, n in enumerate(dict.fromkeys(raw))}
            return [str(n) for n in index], np.fromiter(map(index.__getitem__, raw),
                                                        dtype=np.int64, count=len(raw))
        return self._cached("indices", make)

    @property
    def class_ids(self) -> tuple[list[str], np.ndarray]:
        """Distinct qualified class names, and per call the index of its class."""
        def make():
            names = [c.cls for c in self.calls]
            index = {name: i for i, name in enumerate(dict.fromkeys(names))}
            return list(index), np.fromiter(map(index.__getitem__, names), dtype=np.int64,
                                            count=len(names))
        return self._cached("classes", make)

    @property
    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(start, calls)``: stack ``s`` holds ``calls[start[s]:start[s + 1]]``."""
        def make():
            lengths = np.fromiter((0 if s is None else len(s) for s in self.ids),
                                  dtype=np.int64, count=len(self.ids))
            start = np.zeros(len(self.ids) + 1, dtype=np.int64)
            np.cumsum(lengths, out=start[1:])
            flat = np.fromiter(chain.from_iterable(s for s in self.ids if s is not None),
                               dtype=np.int64, count=int(start[-1]))
            return start, flat
        return self._cached("csr", make)
