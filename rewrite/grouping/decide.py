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
from attrs import field, frozen

from rewrite.compile import Rule, Subjects


@frozen
class Decisions:
    """The winning rule of every call, as ranks into :attr:`ranked` (-1: no rule matched)."""

    ranked: tuple[Rule, ...]
    """The group and flat rules, strongest first."""
    winner: np.ndarray = field(repr=False)
    grouped: np.ndarray = field(repr=False)
    """Bool per call: its winner is a ``group`` rule."""

    def rule_of(self, call: int) -> Rule | None:
        """The group rule that makes call ``call`` a group, or None."""
        return self.ranked[int(self.winner[call])] if self.grouped[call] else None


def decide_calls(subjects: Subjects, rules: Sequence[Rule], hits: Counter) -> Decisions:
    """The winning rule of every call; counts matched calls per rule in ``hits``."""
    winner = np.full(subjects.size, -1, dtype=np.int64)
    ranked = tuple(sorted(rules, key=lambda r: (r.priority, r.order), reverse=True))
    for rank, rule in enumerate(ranked):
        matched = rule.mask(subjects)
        count = int(np.count_nonzero(matched))
        hits[rule.order] += count
        if count:
            winner[matched & (winner < 0)] = rank
    is_group = np.array([r.kind == "group" for r in ranked] + [False], dtype=bool)
    return Decisions(ranked, winner, is_group[winner])
