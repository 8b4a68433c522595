"""Stage 2: the graph IR every frontend produces and every matcher reads."""

from rewrite.ir.columns import Columns
from rewrite.ir.model import Graph, ModuleCall, Node, Stack
from rewrite.ir.nodes import LazyNodes

__all__ = ["Columns", "Graph", "LazyNodes", "ModuleCall", "Node", "Stack"]
