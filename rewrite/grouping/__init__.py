"""Stage 4: rules x IR -> group tree."""

from rewrite.grouping.build import group_graph
from rewrite.grouping.grouped import Grouped
from rewrite.grouping.tree import Group, GroupTree

__all__ = ["Group", "GroupTree", "Grouped", "group_graph"]
