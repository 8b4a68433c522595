"""A program's twin: the same call traced at smaller sizes, checked in its stead.

A static export's example is a whole chunk over the whole context (128 tokens over 2048 slots
at ``--static batch=1,seq=128 --context 2048``), and its program's sizes are fixed: checking
it against the model means running a 1.24B model twice over the chunk, more than the rest of
the export. Its twin is the same call at one row of :data:`TOKENS` tokens over
:data:`SLOTS` slots, traced, cut and extended the same way; the twin is checked
(:func:`rewrite.exporting.once.check_bodies`, the one check), and its verdict stands for the
export's program when the two graphs are :func:`alike`: the same nodes, in the same order, on
the same inputs, calling the same ops with the same arguments but for their sizes. What
sizes cannot change, the wiring of the added layers and each layer's body, is then checked;
where the graphs are not alike (code that branches on a size), the program is checked itself.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

if TYPE_CHECKING:
    import torch

TOKENS, SLOTS = 2, 8
"""The twin's chunk (two tokens: one attends the other) and context."""


@frozen(eq=False)
class Twin:
    """Example inputs of the export's call, smaller (:data:`TOKENS` over :data:`SLOTS`); the
    program traced at them and its check's verdict, once for all the export's chunk
    lengths (``made``)."""

    args: tuple
    made: dict = field(factory=dict)

    def stands_for(self, example: tuple) -> bool:
        """Whether ``example`` holds more elements than the twin's inputs (its check costs
        more)."""
        return _elements(example) > _elements(self.args)


def _elements(example: Any) -> int:
    import torch
    import torch.utils._pytree as pytree

    return sum(t.numel() for t in pytree.tree_leaves(example) if isinstance(t, torch.Tensor))


def alike(a: "torch.export.ExportedProgram", b: "torch.export.ExportedProgram") -> bool:
    """Whether two programs compute alike but for their sizes: the same inputs and outputs
    (kinds and targets) and :func:`graphs_alike`."""
    def specs(program: "torch.export.ExportedProgram") -> tuple:
        signature = program.graph_signature
        return tuple((s.kind, s.target) for s in (*signature.input_specs,
                                                  *signature.output_specs))

    return specs(a) == specs(b) and graphs_alike(a.graph_module, b.graph_module)


def graphs_alike(a: "torch.fx.GraphModule", b: "torch.fx.GraphModule") -> bool:
    """The same nodes in order, each with the same op, target and arguments (nodes as the
    same positions), an int argument aside (a size; not an output's index), and the
    submodules they read (``invoke_subgraph`` bodies) alike too."""
    left, right = list(a.graph.nodes), list(b.graph.nodes)
    if len(left) != len(right):
        return False
    at: dict = {}
    for n, (x, y) in enumerate(zip(left, right)):
        at[x], at[y] = n, n
        if x.op != y.op or not _arguments_alike((x.args, x.kwargs), (y.args, y.kwargs), at,
                                                x.target is operator.getitem):
            return False
        bodies = _body(a, x), _body(b, y)
        if None in bodies and x.target != y.target \
                or None not in bodies and not graphs_alike(*bodies):
            return False
    return True


def _body(gm: "torch.fx.GraphModule", node: "torch.fx.Node") -> "torch.fx.GraphModule | None":
    """The graph module ``node`` reads (an ``invoke_subgraph`` body), or None."""
    import torch

    if node.op != "get_attr":
        return None
    try:
        found = gm.get_submodule(node.target)
    except AttributeError:
        return None
    return found if isinstance(found, torch.fx.GraphModule) else None


def _arguments_alike(x: Any, y: Any, at: dict, exact: bool) -> bool:
    import torch

    if isinstance(x, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(
            _arguments_alike(p, q, at, exact) for p, q in zip(x, y))
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(
            _arguments_alike(x[k], y[k], at, exact) for k in x)
    if isinstance(x, torch.fx.Node):
        return isinstance(y, torch.fx.Node) and at.get(x, -1) == at.get(y, -2)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(x) is type(y) and str(x) == str(y)
    if type(x) is int and not exact:
        return type(y) is int
    return type(x) is type(y) and x == y
