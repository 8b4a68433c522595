"""Tag rules: set tags on the nodes their selector matches.

Tag rules run before group rules (whose tag tests see their result), one after the other in
order of ``priority`` then file order: a later rule sees the tags earlier ones set, and when
two rules set the same key on a node the one that runs last wins (higher priority, then the
rule written later). Graph inputs and outputs are never tagged.

A rule is evaluated for all nodes at once (numpy masks, see :class:`NodeSubjects`); new tag
sets are made once per distinct old set.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from rewrite.compile import Rule
from rewrite.grouping.measures import CallMeasures
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import NodeSubjects
from rewrite.ir.columns import TagSets


def apply_tag_rules(
    table: StackTable, sid: np.ndarray, target_id: np.ndarray, targets: Sequence[str],
    tags_id: np.ndarray, tag_table: TagSets, is_io: np.ndarray, rules: Sequence[Rule],
    hits: Counter, measures: CallMeasures,
) -> np.ndarray:
    """Each node's tag set id after the tag rules; counts matched nodes per rule in ``hits``."""
    if not rules:
        return tags_id
    inside = np.flatnonzero(~is_io)
    subjects = NodeSubjects(table, sid[inside], target_id[inside], targets, tags_id[inside],
                            tag_table.values, measures)
    for rule in sorted(rules, key=lambda r: (r.priority, r.order)):
        matched = rule.mask(subjects)
        count = int(np.count_nonzero(matched))
        hits[rule.order] += count
        if not count:
            continue
        # the new tag set of each old one, made once per distinct old set
        old = subjects.tags[matched]
        distinct = np.flatnonzero(np.bincount(old, minlength=len(tag_table.values)))
        new_of = np.arange(len(tag_table.values), dtype=np.int64)
        for k in distinct.tolist():
            merged = dict(tag_table.values[k])
            merged.update(rule.assignments)
            new_of[k] = tag_table.id(merged)
        new_tags = subjects.tags.copy()
        new_tags[matched] = new_of[old]
        subjects.tags = new_tags
    out = tags_id.copy()
    out[inside] = subjects.tags
    return out
