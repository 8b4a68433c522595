"""What selectors are asked about, answered for all subjects at once (numpy bool arrays).

* :class:`CallSubjects`: one subject per module call (group and flat rules);
* :class:`NodeSubjects`: one subject per node (tag rules).

Both implement :class:`rewrite.compile.selectors.Subjects`: Python work per distinct class,
target and tag set, one regex scan over all call paths per path pattern, and array passes
over the calls, the tree of stacks (:class:`StackTable`) and the nodes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rewrite.compile.patterns import ClassGlob, Glob, OpGlob, TextColumn
from rewrite.grouping.measures import CallMeasures
from rewrite.grouping.stacks import StackTable


class _CallColumns:
    """Per-call answers over a :class:`StackTable` (its cached per-call columns)."""

    def __init__(self, table: StackTable) -> None:
        self.table = table
        self.size = len(table.calls)
        self._paths: TextColumn | None = None

    @property
    def paths(self) -> TextColumn:
        if self._paths is None:
            calls = self.table.call_columns
            self._paths = TextColumn(calls.paths, calls.path_id, calls.distinct_paths)
        return self._paths

    def path_mask(self, glob: Glob) -> np.ndarray:
        if glob.matches_all:
            return np.ones(self.size, dtype=bool)
        return glob.mask(self.paths)

    def key_mask(self, path: Glob, index: Glob) -> np.ndarray:
        mask = self.path_mask(path)
        if index.pattern in ("*", "**"):  # an index has no dot: any index
            return mask
        texts, ids = self.table.indices
        return mask & np.array(index.test_all(texts), dtype=bool)[ids]

    def class_mask(self, glob: ClassGlob) -> np.ndarray:
        classes, class_id = self.table.class_ids
        per_class = np.array([glob(c) for c in classes], dtype=bool)
        return per_class[class_id]


def _present(ids: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``ids`` (ids below ``size``), sorted."""
    return np.flatnonzero(np.bincount(ids, minlength=size))


def _target_mask(glob: OpGlob, targets: Sequence[str], present: np.ndarray) -> np.ndarray:
    """Per target id: matches ``glob`` (only the ``present`` ids are asked)."""
    out = np.zeros(len(targets), dtype=bool)
    ids = present.tolist()
    out[ids] = [glob(targets[t]) for t in ids]
    return out


def _tag_test(tag_sets: Sequence[Mapping[str, str]], key: str, value: str | None) -> np.ndarray:
    """Per tag set: has ``key`` (``value`` None) or ``key == value``."""
    if value is None:
        return np.fromiter((key in t for t in tag_sets), dtype=bool, count=len(tag_sets))
    return np.fromiter((t.get(key) == value for t in tag_sets), dtype=bool, count=len(tag_sets))


class CallSubjects:
    """Module calls as subjects, given the nodes' final stacks, targets and tags."""

    def __init__(self, table: StackTable, sid: np.ndarray, inside: np.ndarray,
                 target_id: np.ndarray, targets: Sequence[str], tags_id: np.ndarray,
                 tag_sets: Sequence[Mapping[str, str]], measures: CallMeasures) -> None:
        self._cols = _CallColumns(table)
        self._measures = measures
        self.size = self._cols.size
        self._sid = sid
        self._inside = inside
        """Bool per node: counts for the calls of its stack (not a graph input/output)."""
        self._target_id, self._targets = target_id, targets
        self._tags_id, self._tag_sets = tags_id, tag_sets
        self._present: np.ndarray | None = None

    def path_mask(self, glob: Glob) -> np.ndarray:
        return self._cols.path_mask(glob)

    def key_mask(self, path: Glob, index: Glob) -> np.ndarray:
        return self._cols.key_mask(path, index)

    def class_mask(self, glob: ClassGlob) -> np.ndarray:
        return self._cols.class_mask(glob)

    def _calls_with(self, node_mask: np.ndarray) -> np.ndarray:
        """Per call: some node inside it is set in ``node_mask``."""
        stacks = np.zeros(len(self._cols.table), dtype=bool)
        stacks[self._sid[node_mask & self._inside]] = True
        return self._cols.table.calls_in(stacks)

    def op_mask(self, glob: OpGlob) -> np.ndarray:
        if self._present is None:
            self._present = _present(self._target_id[self._inside], len(self._targets))
        per_target = _target_mask(glob, self._targets, self._present)
        return self._calls_with(per_target[self._target_id])

    def tag_mask(self, key: str, value: str | None) -> np.ndarray:
        ok = _tag_test(self._tag_sets, key, value)[self._tags_id]
        return ~self._calls_with(~ok)

    def measure_mask(self, measure: str, op: str, value: int) -> np.ndarray:
        return self._measures.mask(measure, op, value)


class NodeSubjects:
    """Nodes as subjects (by their stack, target and tag set ids); tags can be updated."""

    def __init__(self, table: StackTable, stack: np.ndarray, target: np.ndarray,
                 targets: Sequence[str], tags: np.ndarray, tag_sets: list[Mapping[str, str]],
                 measures: CallMeasures):
        self._cols = _CallColumns(table)
        self._measures = measures
        self.size = len(stack)
        self.stack, self.target, self.tags = stack, target, tags
        self._targets = targets
        self.tag_sets = tag_sets
        """Grows as tag rules make new tag sets; ``tags`` indexes it."""
        self._call_memo: dict[tuple, np.ndarray] = {}
        self._present: np.ndarray | None = None

    def _any_call(self, key: tuple, call_mask) -> np.ndarray:
        per_stack = self._call_memo.get(key)
        if per_stack is None:
            per_stack = self._call_memo[key] = _any_per_stack(self._cols, call_mask())
        return per_stack[self.stack]

    def path_mask(self, glob: Glob) -> np.ndarray:
        return self._any_call(("path", glob.pattern), lambda: self._cols.path_mask(glob))

    def key_mask(self, path: Glob, index: Glob) -> np.ndarray:
        return self._any_call(("key", path.pattern, index.pattern),
                              lambda: self._cols.key_mask(path, index))

    def class_mask(self, glob: ClassGlob) -> np.ndarray:
        return self._any_call(("class", glob.pattern), lambda: self._cols.class_mask(glob))

    def op_mask(self, glob: OpGlob) -> np.ndarray:
        if self._present is None:
            self._present = _present(self.target, len(self._targets))
        per_target = _target_mask(glob, self._targets, self._present)
        return per_target[self.target]

    def tag_mask(self, key: str, value: str | None) -> np.ndarray:
        return _tag_test(self.tag_sets, key, value)[self.tags]

    def measure_mask(self, measure: str, op: str, value: int) -> np.ndarray:
        return self._any_call(("measure", measure, op, value),
                              lambda: self._measures.mask(measure, op, value))


def _any_per_stack(cols: _CallColumns, call_mask: np.ndarray) -> np.ndarray:
    """Per stack id: some call of the stack is set in ``call_mask``."""
    return cols.table.any_call(call_mask)
