"""What a module call is, as integers per call: what ``size >= 100``, ``depth <= 2``,
``repeats >= 2`` and ``call 0`` compare.

* ``size``: the operations inside the call: its non-input/output nodes, including those of
  the calls nested in it and the nodes without a stack placed into it (the total of the
  subtree, which is what a runtime weighs when it inlines small functions);
* ``depth``: the number of module calls on its stack, itself included: 1 for a call of a
  top-level module (``h.0``), 2 for one inside it (``h.0.attn``);
* ``repeats``: the number of module calls in the model of the same qualified class (a shared
  module called twice counts twice);
* ``call``: the call index (0 for the first call of a module, 1 for ``shared@1``).

Each is one array over the calls, made on first use by array passes over the tree of stacks
(:class:`StackTable`): rules that compare nothing pay nothing.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from attrs import frozen

from rewrite.compile.selectors import COMPARE
from rewrite.grouping.stacks import StackTable


@frozen
class Measures:
    """The measures of one module call (see the module docstring)."""

    size: int
    depth: int
    repeats: int
    call: int

    def as_dict(self) -> dict[str, int]:
        return {"size": self.size, "depth": self.depth, "repeats": self.repeats,
                "call": self.call}


class CallMeasures:
    """The measures of every call of a :class:`StackTable`, each an int array per call id."""

    def __init__(self, table: StackTable, sid: np.ndarray, inside: np.ndarray) -> None:
        self.table = table
        self._sid = sid
        """Per node, its (placed) stack id."""
        self._inside = inside
        """Bool per node: counts as an operation (not a graph input or output)."""
        self._made: dict[str, np.ndarray] = {}
        self._makers: dict[str, Callable[[], np.ndarray]] = {
            "size": self._size, "depth": self._depth, "repeats": self._repeats,
            "call": self._call}

    def __getitem__(self, measure: str) -> np.ndarray:
        found = self._made.get(measure)
        if found is None:
            found = self._made[measure] = self._makers[measure]()
        return found

    def mask(self, measure: str, op: str, value: int) -> np.ndarray:
        """Bool per call: ``measure op value`` holds."""
        return np.asarray(COMPARE[op](self[measure], value), dtype=bool)

    def of(self, call: int) -> Measures:
        """The measures of call id ``call``."""
        return Measures(*(int(self[m][call]) for m in ("size", "depth", "repeats", "call")))

    def _size(self) -> np.ndarray:
        parent, last, depth, levels = self.table.tree()
        total = np.bincount(self._sid[self._inside], minlength=len(parent)).astype(np.int64)
        for level in reversed(levels):  # each stack's count into its parent's, deepest first
            np.add.at(total, parent[level], total[level])
        known = np.flatnonzero(depth > 0)
        return np.bincount(last[known], weights=total[known],
                           minlength=len(self.table.calls)).astype(np.int64)

    def _depth(self) -> np.ndarray:
        _, last, depth, _ = self.table.tree()
        out = np.zeros(len(self.table.calls), dtype=np.int64)
        known = depth > 0
        out[last[known]] = depth[known]
        return out

    def _repeats(self) -> np.ndarray:
        _, class_id = self.table.class_ids
        class_id = np.asarray(class_id, dtype=np.int64)
        return np.bincount(class_id)[class_id].astype(np.int64)

    def _call(self) -> np.ndarray:
        return np.asarray(self.table.call_columns.index, dtype=np.int64)
