"""Private parts of torch's FX graphs and exported programs that the backend reads or sets.

``torch._ops`` (the classes of op overloads and higher-order operators, an overload's schema),
``ExportedProgram._graph_module`` (a program with a new graph module, its signature,
state and constants kept: there is no public way to make one without re-exporting) and a
symbolic boolean's expression, ``SymBool.node.expr`` (the conditions of a program's runtime
asserts: :func:`runtime_conditions`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


_METADATA_ONLY = frozenset([torch.ops.aten.detach_.default])
"""In-place ops that change only autograd metadata: the value they return is their input's
(``torch.tensor(...)`` under torch.export: ``detach_(lift_fresh_copy(constant))``)."""


def is_in_place(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an op overload whose schema says it mutates an argument's value
    (not :func:`is_metadata_only`)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target._schema.is_mutable and node.target not in _METADATA_ONLY


def functional_forms(graph: torch.fx.Graph) -> dict[torch.fx.Node, torch._ops.OpOverload]:
    """The copies of ``graph`` that functionalization would only rename, each with its
    functional overload (``copy_`` -> ``copy``: the same value, nothing written): the copy
    writes a tensor made inside the graph (by an op returning a new tensor, maybe through ops
    that return views or aliases of it: not an input, a buffer, a constant), which no node
    reads after it but through the copy's own result (a recurrent layer's state written into
    a clone of the cache's, then returned). Other in-place ops are left to functionalization
    (Llama 4's router ``scatter_`` and shared expert's ``add_`` written so, torch.onnx's
    decomposition left an ``aten.sym_numel`` it cannot translate).
    Computing this is linear in the graph, where functionalization re-traces it."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    return {node: torch.ops.aten.copy.default for node in graph.nodes
            if node.op == "call_function" and node.target is torch.ops.aten.copy_.default
            and _written_fresh(node, position)}


def _written_fresh(node: torch.fx.Node, position: dict[torch.fx.Node, int]) -> bool:
    """Whether ``node`` writes a tensor made inside the graph that no node reads after it
    (:func:`functional_forms`)."""
    chain = [node]
    value = node.args[0]
    while True:
        if not isinstance(value, torch.fx.Node) or not _read_before(
                value, chain[-1], node, position):
            return False
        chain.append(value)
        if value.op != "call_function" or not isinstance(value.target, torch._ops.OpOverload):
            return False
        if not _may_alias(value):
            return True  # a new tensor
        value = value.args[0] if value.args else None


def _read_before(value: torch.fx.Node, via: torch.fx.Node, node: torch.fx.Node,
                 position: dict[torch.fx.Node, int]) -> bool:
    """Whether every user of ``value`` but ``via`` comes before ``node`` (or is it), and so
    does, through users that may alias their input, every reader of those aliases."""
    for user in value.users:
        if user is via or user is node:
            continue
        if position[user] > position[node]:
            return False
        if _may_alias(user) and not _read_before(user, node, node, position):
            return False
    return True


def _may_alias(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result may be (a view of) one of its inputs: anything but an op
    whose schema returns new tensors."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in node.target._schema.returns)


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


def runtime_conditions(program: torch.export.ExportedProgram) -> list[Any]:
    """The sympy conditions on sizes that ``program`` asserts at run time
    (``aten._assert_scalar`` of a symbolic boolean), in its graph and its subgraphs (a
    layer's ``invoke_subgraph`` body)."""
    conditions = []
    for gm in program.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.find_nodes(op="call_function",
                                        target=torch.ops.aten._assert_scalar.default):
            arg = node.args[0] if node.args else None
            value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if isinstance(value, torch.SymBool):
                conditions.append(value.node.expr)
    return conditions


def standard_sympy(expr: Any) -> Any:
    """``expr`` (a size expression of torch's) with torch's own sympy functions (its ``Min``,
    ``Max``, ``FloorDiv``, ``PythonMod``... of ``torch.utils._sympy.functions``) written as
    sympy's, about which sympy reasons; a function not known here is kept (all of them
    without that module)."""
    import sympy

    try:
        from torch.utils._sympy import functions
    except ImportError:  # pragma: no cover - not in the checked versions
        return expr

    table = {"Min": sympy.Min, "Max": sympy.Max, "Mod": sympy.Mod, "PythonMod": sympy.Mod,
             "FloorDiv": lambda a, b: sympy.floor(a / b),
             "CeilDiv": lambda a, b: sympy.ceiling(a / b),
             "CleanDiv": lambda a, b: a / b, "IntTrueDiv": lambda a, b: a / b,
             "PowByNatural": sympy.Pow, "FloorToInt": sympy.floor,
             "CeilToInt": sympy.ceiling, "Identity": lambda a: a}
    known = {getattr(functions, name): made for name, made in table.items()
             if hasattr(functions, name)}
    return expr.replace(lambda e: type(e) in known, lambda e: known[type(e)](*e.args))
