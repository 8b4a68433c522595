"""Which module calls become groups: the winning group or flat rule of each call.

Every call is decided on its own. Among the group and flat rules whose selector matches the
call, the one with the highest ``priority`` wins; on equal priority the rule written last
wins (after includes are spliced in where they stand). A ``group`` winner makes the call a
group; a ``flat`` winner, or no matching rule, leaves it inline: its nodes belong to the
nearest enclosing group. A call's decision does not depend on its parents' or children's, so
``flat`` on a block does not flatten the attention group inside it.

A call is asked about by its own path, key and class; ``op`` tests look at every node inside
the call, tag tests require every node inside the call to carry the tag (see
:mod:`rewrite.compile.selectors`). Each rule is evaluated once for all calls
(:class:`~rewrite.grouping.subjects.CallSubjects`).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from rewrite.compile import Rule, Subjects


def decide_calls(subjects: Subjects, rules: Sequence[Rule], hits: Counter) -> list[Rule | None]:
    """Per call id: the group rule that makes it a group, or None (flat or unmatched)."""
    winner = np.full(subjects.size, -1, dtype=np.int64)
    ranked = sorted(rules, key=lambda r: (r.priority, r.order), reverse=True)
    for rank, rule in enumerate(ranked):
        matched = rule.mask(subjects)
        count = int(matched.sum())
        hits[rule.order] += count
        if count:
            winner[matched & (winner < 0)] = rank
    chosen: list[Rule | None] = [None] * subjects.size
    for call, rank in enumerate(winner.tolist()):
        if rank >= 0 and ranked[rank].kind == "group":
            chosen[call] = ranked[rank]
    return chosen
