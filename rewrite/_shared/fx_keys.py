"""When two FX nodes, or two FX bodies, count as the same: the one definition the FX backend
(code keys), the per-body ONNX lowering (which calls share one decomposed body) and ``rewrite
suggest`` (distinct bodies per class) use.

* :func:`freeze`: a node argument as a hashable key;
* :func:`target_key`: a node target as a hashable key;
* :func:`body_key`: a run of nodes, up to node names, as a hashable key (a higher-order op's
  subgraph, read by a ``get_attr`` node, by its own nodes: :func:`graph_key`).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import torch

_SCALARS = (bool, int, str, type(None))
_BY_REPR = (float, complex, torch.dtype, torch.device, torch.layout, torch.memory_format)
"""Values whose ``repr`` is what code generation writes; other objects count by identity."""


def _by_name(node: torch.fx.Node) -> Hashable:
    return ("%", node.name)


def freeze(arg: Any, node_key: Callable[[torch.fx.Node], Hashable] = _by_name) -> Hashable:
    """``arg`` (an FX node argument, nested) as a hashable key: nodes by ``node_key`` (by
    name), scalars by value, floats and torch enums by ``repr``, any other object by
    identity."""
    kind = type(arg)
    if kind is torch.fx.Node:
        return node_key(arg)
    if kind in _SCALARS:
        return (kind, arg)
    if isinstance(arg, (tuple, list)):
        return (kind, tuple([freeze(a, node_key) for a in arg]))
    if isinstance(arg, dict):
        return ("dict", tuple([(k, freeze(v, node_key)) for k, v in arg.items()]))
    if isinstance(arg, slice):
        return ("slice", freeze(arg.start, node_key), freeze(arg.stop, node_key),
                freeze(arg.step, node_key))
    if kind in _BY_REPR:
        return (kind, repr(arg))
    return (kind, id(arg))  # the very object (a global of the generated code)


def target_key(node: torch.fx.Node) -> Hashable:
    """A node's target: an attribute or method name by value, an op or function by identity
    (code generation names globals after the objects)."""
    target = node.target
    if isinstance(target, str):
        return target
    return ("id", id(target))


def body_key(nodes: Sequence[torch.fx.Node]) -> tuple[Hashable, list[torch.fx.Node]]:
    """Structural key of a body (``nodes``, in graph order), and its inputs (values from
    outside, in order of first use).

    Equal keys: the same ops, targets and constant arguments (:func:`freeze`), node by node;
    each argument reads the same member, or the same input; the inputs have the same types
    and shapes; a subgraph read by a ``get_attr`` node (a scan's step) is the same graph
    (:func:`graph_key`), whatever its attribute's name. Node names and which values leave
    the body do not count."""
    position = {node: i for i, node in enumerate(nodes)}
    inputs: dict[torch.fx.Node, int] = {}

    def ref(arg: torch.fx.Node) -> Hashable:  # no frozen value starts with "node" / "in"
        at = position.get(arg)
        if at is not None:
            return ("node", at)
        return ("in", inputs.setdefault(arg, len(inputs)))

    parts = []
    for node in nodes:
        parts.append((node.op, _member_target(node), freeze(node.args, ref),
                      freeze(node.kwargs, ref)))
    types = tuple([_value_type(value.meta.get("val")) for value in inputs])
    return (tuple(parts), types), list(inputs)


def graph_key(graph: torch.fx.Graph) -> Hashable:
    """A whole graph (a higher-order op's subgraph) as a key: its nodes as :func:`body_key`
    keys them (placeholders and output included) and its placeholders' types and shapes."""
    nodes = list(graph.nodes)
    types = tuple([_value_type(n.meta.get("val")) for n in nodes if n.op == "placeholder"])
    return body_key(nodes)[0], types


def _member_target(node: torch.fx.Node) -> Hashable:
    """:func:`target_key`, except that a ``get_attr`` of a subgraph is keyed by its graph."""
    if node.op == "get_attr" and node.graph.owning_module is not None:
        value = _attribute(node.graph.owning_module, node.target)
        if isinstance(value, torch.fx.GraphModule):
            return ("graph", graph_key(value.graph))
    return target_key(node)


def _attribute(owner: torch.nn.Module, target: str) -> Any:
    """``owner``'s attribute at the dotted path ``target`` (None: not there)."""
    value: Any = owner
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _value_type(val: Any) -> Hashable:
    """The type and shape of an example value (symbolic sizes by name)."""
    if isinstance(val, torch.Tensor):
        return (tuple([d if type(d) is int else str(d) for d in val.shape]), val.dtype)
    return repr(val)
