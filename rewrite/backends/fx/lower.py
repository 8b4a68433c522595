"""``Result.to_fx()``: a group tree -> a hierarchical (or split) ``torch.fx.GraphModule``.

Stages, each in its own module: read the source program (:mod:`source`), index the groups
(:mod:`hierarchy`), name submodules after the original model (:mod:`layout`), derive the data
flow between groups (:mod:`flow`), build graphs and modules (:mod:`build`), compile each
distinct body once (:mod:`compile`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rewrite._shared.gc import gc_paused
from rewrite.files.mapped import verify
from rewrite.backends.fx.build import build_modules
from rewrite.backends.fx.compile import compile_tree
from rewrite.backends.fx.flow import Flow, plan_flow
from rewrite.backends.fx.hierarchy import Hierarchy, build_hierarchy
from rewrite.backends.fx.layout import Layout, finish_layout, natural_layout
from rewrite.backends.fx.module import LoweredModule
from rewrite.backends.fx.source import FxSource, read_source
from rewrite.errors import InputError

if TYPE_CHECKING:
    from rewrite.grouping import Grouped


def _reserved(h: Hierarchy, layout: Layout, flow: Flow, source: FxSource) -> list[set[str]]:
    """Per group, first segments of the names its attributes and leaf modules take."""
    reserved: list[set[str]] = [set() for _ in range(len(h))]
    for gid in range(len(h)):
        for node in flow.attributes[gid]:
            reserved[gid].add(layout.relative(gid, source.attributes[node].fqn).split(".", 1)[0])
        for node in h.direct[gid]:
            if node.op == "call_module":
                target = str(node.target)
                name = layout.relative(gid, target) if layout.owns(h, gid, target) else target
                reserved[gid].add(name.split(".", 1)[0])
    reserved[0] |= {a.fqn.split(".", 1)[0] for a in source.all_attributes}
    return reserved


def to_fx(result: "Grouped") -> torch.fx.GraphModule:
    """Lower ``result``'s groups to nested GraphModules (see the package docstring)."""
    with gc_paused():
        module = _lower(result)
    verify(result.tree.graph.mapped)  # the .pt2 the weights are views of: intact
    return module


def _lower(result: "Grouped") -> torch.fx.GraphModule:
    tree = result.tree
    graph = tree.graph
    if graph.kind != "fx":
        raise InputError(
            f"FX output needs a PyTorch model (.pt2, ExportedProgram or GraphModule); this "
            f"model was read from {graph.kind.upper()}; write .onnx instead"
        )
    source = read_source(graph.source, graph.root_class)
    h = build_hierarchy(tree, source)
    location, namespace = natural_layout(h)
    draft = Layout(tuple(loc or "" for loc in location), tuple(namespace))
    flow = plan_flow(h, draft, source)
    layout = finish_layout(h, location, namespace, _reserved(h, draft, flow, source))
    built = build_modules(h, layout, flow, source)
    compile_tree(built.root, built.keys)
    return built.root


__all__ = ["LoweredModule", "to_fx"]
