"""How many structurally distinct bodies the calls of one class have (an estimate).

Two calls have the same *body key* when their nodes (those of nested calls included), in
graph order, have the same targets and constant arguments (FX arguments that are not values,
ONNX attributes), read each other in the same way, and read the same types and shapes from
outside. That is close to what the ONNX backend compares when it shares one function between
calls (:mod:`rewrite.backends.onnx.structure`), without lowering: an estimate, exact for the
usual repeated blocks, that may count two bodies the optimizer would make equal (or the
reverse).
"""

from __future__ import annotations

import hashlib
from typing import Any, Hashable, Iterable, Sequence

from rewrite.ir import Graph, ModuleCall, Node


def body_keys(graph: Graph, calls: Iterable[ModuleCall]) -> dict[ModuleCall, Hashable]:
    """The body key of each of ``calls``."""
    wanted = set(calls)
    members: dict[ModuleCall, list[Node]] = {c: [] for c in wanted}
    for node in graph.nodes:
        if node.is_io or not node.stack:
            continue
        for call in node.stack:
            if call in wanted:
                members[call].append(node)
    nodes = graph.nodes
    return {call: _key(inside, nodes) for call, inside in members.items()}


def _key(inside: list[Node], nodes: Sequence[Node]) -> Hashable:
    local = {n.index: k for k, n in enumerate(inside)}
    outside: dict[int, int] = {}
    parts = []
    for node in inside:
        refs = []
        for i in node.inputs:
            if i in local:
                refs.append(local[i])
            else:
                if i not in outside:
                    outside[i] = len(outside)
                refs.append(("in", outside[i], _value_type(nodes[i])))
        parts.append((node.target, _constants(node.source), tuple(refs)))
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def _constants(source: Any) -> Hashable:
    """The constant settings of a node: FX arguments that are not values, ONNX attributes."""
    if source is None:
        return None
    attributes = getattr(source, "attributes", None)
    if attributes is not None:  # an onnx_ir.Node
        return tuple((name, _attribute(attr)) for name, attr in attributes.items())
    args, kwargs = getattr(source, "args", None), getattr(source, "kwargs", None)
    if args is None:
        return None
    import torch.fx

    strip = lambda a: torch.fx.node.map_arg(a, lambda _: "%")  # noqa: E731
    return repr((strip(args), strip(kwargs)))


def _attribute(attr: Any) -> Hashable:
    value = attr.value
    if hasattr(value, "tobytes"):  # a tensor attribute: by content
        return (str(getattr(value, "dtype", "")), hashlib.blake2b(
            value.tobytes(), digest_size=16).hexdigest())
    return repr(value)


def _value_type(node: Node) -> Hashable:
    """The types and shapes of what a node produces, as far as the source says."""
    source = node.source
    if source is None:
        return None
    meta = getattr(source, "meta", None)
    if isinstance(meta, dict) and "val" in meta:  # a torch.fx.Node
        return _fake_type(meta["val"])
    outputs = getattr(source, "outputs", None)
    values = outputs if outputs is not None else [source]  # an onnx_ir.Node, or Value
    return tuple((str(v.dtype), str(v.shape)) for v in values)


def _fake_type(value: Any) -> Hashable:
    if isinstance(value, (list, tuple)):
        return tuple(_fake_type(v) for v in value)
    shape = getattr(value, "shape", None)
    if shape is None:
        return repr(type(value).__name__)
    return (str(getattr(value, "dtype", "")), tuple(str(d) for d in shape))
