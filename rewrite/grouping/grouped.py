"""What grouping hands the backends: one model grouped under one rule set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from rewrite.grouping.tree import GroupTree

if TYPE_CHECKING:
    from rewrite.compile import RuleSet


@frozen
class Grouped:
    """Groups of one model under one rule set: the backends' input (the library's
    :class:`rewrite.Result` is one, with the methods that call them)."""

    rules: "RuleSet" = field(repr=False)
    tree: GroupTree
    model: Any = field(repr=False, eq=False)
    """What ``apply`` was given (a path is kept as given)."""

    @property
    def warnings(self) -> tuple:
        return self.tree.warnings
