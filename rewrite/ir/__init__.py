"""The graph IR: what stage 3 (frontends) produces and stage 4 (grouping) reads."""

from rewrite.ir.columns import Columns
from rewrite.ir.graph import Graph
from rewrite.ir.model import ModuleCall, Node, Stack
from rewrite.ir.nodes import LazyNodes

__all__ = ["Columns", "Graph", "LazyNodes", "ModuleCall", "Node", "Stack"]
