"""Stage 2: the graph IR every frontend produces and every matcher reads."""

from rewrite.ir.model import Graph, ModuleCall, Node, Stack

__all__ = ["Graph", "ModuleCall", "Node", "Stack"]
