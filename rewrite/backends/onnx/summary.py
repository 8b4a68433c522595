"""The function tree of a model as data: which function calls which, how often, and what each
call passes (the CLI renders it: :func:`rewrite.cli.render.function_tree`, ``explain
--html``)."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir
from attrs import frozen

FunctionId = tuple[str, str, str]
"""A model-local function's ``(domain, name, overload)``, as ``Model.functions`` keys it: the
one function-id type of the backend."""


@frozen
class FunctionSummary:
    """One model-local function."""

    id: FunctionId
    nodes: int
    """Nodes in its body (calls included)."""
    calls: Counter
    """Callees -> call sites in the body."""
    instances: int
    """How many times it runs per model run (call sites times the callers' instances)."""
    attributes: tuple[str, ...] = ()
    """The attributes it declares (scalars merging lifted: each call passes its value)."""

    @property
    def label(self) -> str:
        return label(self.id)


def label(fid: FunctionId) -> str:
    """``domain::name`` (``:overload`` when there is one): how people see a function."""
    domain, name, overload = fid
    return f"{domain}::{name}" + (f":{overload}" if overload else "")


@frozen
class CallSite:
    """One call of a function: where it is and the attribute values it passes (the scalars
    merging lifted, see ``merge``)."""

    caller: FunctionId | None
    """The function whose body holds the call; None: the main graph."""
    node: str | None
    """The call node's name (outlining names it after the group's display id)."""
    attributes: dict[str, object]
    """Attribute name -> the value passed (a Python int, float, str or list)."""


def call_sites(model: ir.Model) -> dict[FunctionId, list[CallSite]]:
    """Every function's call sites, in the main graph first, then in function bodies."""
    functions = model.functions
    found: dict[FunctionId, list[CallSite]] = {fid: [] for fid in functions}
    bodies = [(None, model.graph), *((fid, f.graph) for fid, f in functions.items())]
    for caller, graph in bodies:
        for node in graph:
            fid = (node.domain, node.op_type, node.overload)
            if fid in found:
                values = {name: attr.value for name, attr in node.attributes.items()}
                found[fid].append(CallSite(caller, node.name, values))
    return found


def _calls(nodes, functions: dict[FunctionId, ir.Function]) -> Counter:
    found: Counter = Counter()
    for node in nodes:
        fid = (node.domain, node.op_type, node.overload)
        if fid in functions:
            found[fid] += 1
    return found


def top_calls(model: ir.Model) -> Counter:
    """Function -> call sites in the main graph."""
    return _calls(model.graph, model.functions)


def summarize(model: ir.Model) -> dict[FunctionId, FunctionSummary]:
    """Every function of ``model`` with its callees and run count."""
    functions = dict(model.functions)
    callees = {fid: _calls(f, functions) for fid, f in functions.items()}
    instances: Counter = Counter(top_calls(model))
    # functions form a DAG; propagate run counts in a topological order of callers
    indegree = Counter()
    for calls in callees.values():
        for callee in calls:
            indegree[callee] += 1
    order = [fid for fid in functions if indegree[fid] == 0]
    i = 0
    while i < len(order):
        fid = order[i]
        i += 1
        for callee, n in callees[fid].items():
            instances[callee] += instances[fid] * n
            indegree[callee] -= 1
            if indegree[callee] == 0:
                order.append(callee)
    return {
        fid: FunctionSummary(fid, len(functions[fid]), callees[fid], instances[fid],
                             tuple(functions[fid].attributes))
        for fid in functions
    }
