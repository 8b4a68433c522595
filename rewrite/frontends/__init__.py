"""Stage 3: frontends turn a model into the graph IR."""

from rewrite.frontends.fx.graph import from_exported_program, from_fx_graph, from_graph_module
from rewrite.frontends.load import load_graph

__all__ = ["from_exported_program", "from_fx_graph", "from_graph_module", "load_graph"]
