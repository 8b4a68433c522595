"""Tag rules: set tags on the nodes their selector matches.

Tag rules run before group rules (whose tag tests see their result), one after the other in
order of ``priority`` then file order: a later rule sees the tags earlier ones set, and when
two rules set the same key on a node the one that runs last wins (higher priority, then the
rule written later). Graph inputs and outputs are never tagged.

A rule is evaluated once per distinct (stack, target, tags) of the nodes, not per node.
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from rewrite.compile import Rule
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import NodeSubjects
from rewrite.ir.columns import TagSets, tags_key


class TagTable(TagSets):
    """Tag sets by id, starting from a graph's (ids kept), growing as rules add tags."""

    def __init__(self, initial: Sequence[Mapping[str, str]]) -> None:
        super().__init__()
        self.values = []
        self._ids = {}
        for tags in initial:
            self._ids.setdefault(tags_key(tags), len(self.values))
            self.values.append(tags)

    def id(self, tags: Mapping[str, str]) -> int:
        key = tags_key(tags)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.values)
            self.values.append(MappingProxyType(dict(key)))
        return found


def apply_tag_rules(
    table: StackTable, sid: np.ndarray, target_id: np.ndarray, targets: Sequence[str],
    tags_id: np.ndarray, tag_table: TagTable, is_io: np.ndarray, rules: Sequence[Rule],
    hits: Counter,
) -> np.ndarray:
    """Each node's tag set id after the tag rules; counts matched nodes per rule in ``hits``."""
    if not rules:
        return tags_id
    inside = np.flatnonzero(~is_io)
    t_size = max(len(targets), 1)
    g_size = max(len(tag_table.values), 1)
    code = (sid[inside] * t_size + target_id[inside]) * g_size + tags_id[inside]
    unique, inverse, counts = np.unique(code, return_inverse=True, return_counts=True)
    subjects = NodeSubjects(
        table, unique // (t_size * g_size), (unique // g_size) % t_size, targets,
        unique % g_size, tag_table.values,
    )
    for rule in sorted(rules, key=lambda r: (r.priority, r.order)):
        matched = rule.mask(subjects)
        hits[rule.order] += int(counts[matched].sum())
        if not matched.any():
            continue
        updated: dict[int, int] = {}
        new_tags = subjects.tags.copy()
        for k in np.flatnonzero(matched).tolist():
            old = int(new_tags[k])
            new = updated.get(old)
            if new is None:
                merged = dict(tag_table.values[old])
                merged.update(rule.assignments)
                new = updated[old] = tag_table.id(merged)
            new_tags[k] = new
        subjects.tags = new_tags
    out = tags_id.copy()
    out[inside] = subjects.tags[inverse.reshape(-1)]
    return out
