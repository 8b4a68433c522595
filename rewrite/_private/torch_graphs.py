"""Private parts of torch's FX graphs and exported programs that the backend reads or sets.

``torch._ops`` (the classes of op overloads and higher-order operators, an overload's schema)
and ``ExportedProgram._graph_module`` (a program with a new graph module, its signature,
state and constants kept: there is no public way to make one without re-exporting).
"""

from __future__ import annotations

import copy

import torch


_METADATA_ONLY = frozenset([torch.ops.aten.detach_.default])
"""In-place ops that change only autograd metadata: the value they return is their input's
(``torch.tensor(...)`` under torch.export: ``detach_(lift_fresh_copy(constant))``)."""


def is_in_place(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an op overload whose schema says it mutates an argument's value
    (not :func:`is_metadata_only`)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target._schema.is_mutable and node.target not in _METADATA_ONLY


def is_metadata_only(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an in-place op that only changes autograd metadata (``detach_``):
    its value is its first argument."""
    return node.op == "call_function" and node.target in _METADATA_ONLY


def is_higher_order(target: object) -> bool:
    """Whether ``target`` is a higher-order operator (``invoke_subgraph``, ``cond``...)."""
    return isinstance(target, torch._ops.HigherOrderOperator)


def with_graph_module(program: torch.export.ExportedProgram, gm: torch.fx.GraphModule
                      ) -> torch.export.ExportedProgram:
    """A shallow copy of ``program`` (same signature, state and constants) running ``gm``."""
    out = copy.copy(program)
    out._graph_module = gm
    return out
