"""Structural keys: two function bodies with equal keys compute the same thing.

Member order. Keys (and a function's input order) follow the members' order, so isomorphic
bodies must list their members alike even when the graph does not: a node recomputed into a
group (``outlining._recompute``) sits before its reader, while the original sat where the trace put
it. :func:`canonical_order` is a topological order that prefers, among ready nodes, the
smallest *structural label* (a digest of the op, its attributes and its inputs' labels, inputs
from outside labelled by type), and the graph position only between equal labels.
A label is made of a node key's parts (:meth:`Keyer.head`, :meth:`Keyer.attribute`) but its
inputs: a key names a member's output by the member's position, which is what the order decides;
a label names it by the producer's label.

A key is equal for bodies that are equal up to value names, metadata and weight values:
nodes (domain, op, overload, attributes, subgraphs), how values flow between them, which
input or embedded constant each reads, which values are returned, and the types and shapes of
the inputs. Embedded constants and tensor attributes are compared by content.

This is the one definition of "identical body": :mod:`outlining._repeats` compares a body with an
earlier one piece by piece (stopping at the first difference) through the same parts
(:meth:`Keyer.head`, :meth:`Keyer.refs`, :meth:`Keyer.input`, :meth:`Keyer.same_attribute`,
:meth:`Keyer.types`), and ``finishing._merge`` extends the Keyer (scalars seen by kind).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import ChainMap
from typing import Callable, Mapping

import onnx_ir as ir

from rewrite._shared.onnx_ir_nodes import holds_graphs
from rewrite.backends.onnx._keys import BodyKey, Key, NodeKey, Refs
from rewrite._private.onnx_ir_attrs import attribute_dict

_KIND_NAMES = {kind: kind.name for kind in ir.AttributeType}
_SCALARS = (ir.AttributeType.INT, ir.AttributeType.STRING)
_LISTS = (ir.AttributeType.INTS, ir.AttributeType.STRINGS)


class Keyer:
    """Builds keys; caches tensor digests (one model's constants are keyed many times)."""

    def __init__(self) -> None:
        self._digests: dict[int, tuple] = {}

    def tensor(self, tensor: ir.TensorProtocol) -> tuple:
        """``(dtype, shape, digest)`` of a tensor's content."""
        cached = self._digests.get(id(tensor))
        if cached is not None and cached[0] is tensor:
            return cached[1]
        digest = hashlib.blake2b(tensor.tobytes(), digest_size=16).hexdigest()
        key = (str(tensor.dtype), tuple(tensor.shape), digest)
        self._digests[id(tensor)] = (tensor, key)
        return key

    def attribute(self, attr: ir.Attr, refs: Refs, depth: int) -> Key:
        if attr.is_ref():
            return ("ref", attr.ref_attr_name)
        kind = attr.type
        value = attr.value
        if kind in _SCALARS:  # the common kinds first (same keys as the last line)
            return (_KIND_NAMES[kind],
                    value if isinstance(value, (int, str, bytes)) else repr(value))
        if kind in _LISTS:
            return (_KIND_NAMES[kind], tuple(value))
        if kind == ir.AttributeType.FLOAT:
            return ("f", float(value).hex())
        if kind == ir.AttributeType.FLOATS:
            return ("fs", tuple(float(v).hex() for v in value))
        if kind == ir.AttributeType.TENSOR:
            return ("t", self.tensor(value))
        if kind == ir.AttributeType.TENSORS:
            return ("ts", tuple(self.tensor(t) for t in value))
        if kind == ir.AttributeType.GRAPH:
            return ("g", self.graph(value, refs, depth + 1))
        if kind == ir.AttributeType.GRAPHS:
            return ("gs", tuple(self.graph(g, refs, depth + 1) for g in value))
        return (kind.name, value if isinstance(value, (int, str, bytes)) else repr(value))

    def same_attribute(self, attr: ir.Attr, other: ir.Attr) -> bool:
        """``attribute(attr) == attribute(other)`` (outside subgraphs), without building the
        keys of the common kinds."""
        if attr is other:
            return True
        kind = attr.type
        if kind is other.type and not attr.is_ref() and not other.is_ref():
            if kind in _LISTS:
                return tuple(attr.value) == tuple(other.value)
            if kind == ir.AttributeType.FLOAT:
                return float(attr.value).hex() == float(other.value).hex()
            if kind == ir.AttributeType.TENSOR:
                return attr.value is other.value or self.tensor(attr.value) == self.tensor(
                    other.value)
        return self.attribute(attr, {}, 0) == self.attribute(other, {}, 0)

    @staticmethod
    def head(node: ir.Node) -> tuple[str, str, str, int]:
        """What a node's key starts with: ``(domain, op_type, overload, number of outputs)``."""
        return (node.domain, node.op_type, node.overload, len(node.outputs))

    @staticmethod
    def input(value: ir.Value | None, refs: Refs) -> Key:
        """How a body refers to the value one of its nodes reads: ``refs``' key, ``None`` for
        a missing input, ``("outer", name)`` for a value from outside the body."""
        if value is None:
            return None
        # keys are non-empty tuples: build the default only when missing (cheaper)
        return refs.get(id(value)) or ("outer", value.name)

    def node(self, node: ir.Node, refs: Refs, depth: int = 0) -> NodeKey:
        get = refs.get
        # Keyer.input, inlined (the hottest loop of keying)
        inputs = tuple([None if v is None else (get(id(v)) or ("outer", v.name))
                        for v in node.inputs])
        attributes = attribute_dict(node)
        if not attributes:
            attrs: tuple = ()
        elif len(attributes) == 1:
            ((name, a),) = attributes.items()
            attrs = ((name, self.attribute(a, refs, depth)),)
        else:
            attrs = tuple(sorted(
                (name, self.attribute(a, refs, depth)) for name, a in attributes.items()
            ))
        return NodeKey(node.domain, node.op_type, node.overload, len(node.outputs), inputs,
                       attrs)

    def graph(self, graph: ir.Graph, outer: Refs, depth: int) -> Key:
        """Key of a subgraph; values it captures are keyed as the outer body refers to them."""
        local: dict[int, Key] = {}
        refs = ChainMap(local, outer)  # type: ignore[arg-type]
        for k, value in enumerate(graph.inputs):
            local[id(value)] = ("sub", depth, "in", k)
        inits = []
        for value in graph.initializers.values():
            content = value.const_value
            digest = self.tensor(content) if content is not None else value.name
            key = ("sub", depth, "init", digest)
            local[id(value)] = key
            inits.append(key)
        nodes = []
        for j, node in enumerate(graph):
            nodes.append(self.node(node, refs, depth))
            for t, value in enumerate(node.outputs):
                local[id(value)] = ("sub", depth, j, t)
        outputs = tuple(refs.get(id(v)) for v in graph.outputs)
        return (tuple(inits), tuple(nodes), outputs)

    def body(
        self,
        identity: tuple[str, str],
        members: list[ir.Node],
        args: list[ir.Value],
        constants: Mapping[ir.Value, Key],
        outputs: list[ir.Value],
    ) -> BodyKey:
        """Key of a function body (``identity`` is the group's domain and base name)."""
        refs = self.refs(members, args, constants)
        nodes = [self.node(node, refs) for node in members]
        returned = tuple(refs[id(v)] for v in outputs)
        return BodyKey(identity, tuple(nodes), returned, self.types(args))

    @staticmethod
    def refs(members: list[ir.Node], args: list[ir.Value],
             constants: Mapping[ir.Value, Key]) -> dict[int, Key]:
        """How a body refers to the values its nodes read: ``("arg", k)``, an embedded
        constant's key, ``(member, output)``."""
        refs: dict[int, Key] = {id(value): ("arg", k) for k, value in enumerate(args)}
        for value, key in constants.items():
            refs[id(value)] = key
        for j, node in enumerate(members):
            for t, value in enumerate(node.outputs):
                refs[id(value)] = (j, t)
        return refs

    @staticmethod
    def types(args: list[ir.Value]) -> tuple[tuple[str, str], ...]:
        """The part of a body's key that says its inputs' types and shapes."""
        return tuple((str(v.type), str(v.shape)) for v in args)


    def attribute_labels(self, node: ir.Node) -> list[str]:
        """The attributes of ``node`` as :func:`canonical_order` labels them."""
        return [f"{name}={self.attribute(attr, {}, 0)!r}"
                for name, attr in sorted(node.attributes.items())]


def canonical_order(
    keyer: Keyer,
    members: list[ir.Node],
    position: Mapping[ir.Node, tuple],
    constant_key: Callable[[ir.Value], Key | None],
) -> list[ir.Node]:
    """``members`` in the canonical order described in the module docstring."""
    member_set = set(members)
    producers: dict[ir.Node, list[ir.Node]] = {}
    for node in members:
        found = []
        for value in _read_values(node):
            producer = value.producer()
            if producer in member_set and producer is not node:
                found.append(producer)
        producers[node] = found
    by_position = _kahn(members, producers, position.__getitem__)
    labels: dict[ir.Node, str] = {}
    for node in by_position:
        parts = [str(part) for part in keyer.head(node)]  # as in a node's key
        for value in node.inputs:
            if value is None:
                parts.append("-")
                continue
            producer = value.producer()
            if producer in member_set:
                parts.append(f"{labels[producer]}:{value.index()}")
            else:
                const = constant_key(value)
                parts.append(
                    repr(const) if const is not None else f"in:{value.type}:{value.shape}"
                )
        parts.extend(keyer.attribute_labels(node))
        labels[node] = hashlib.blake2b("|".join(parts).encode(), digest_size=12).hexdigest()
    return _kahn(members, producers, lambda n: (labels[n], position[n]))


def _read_values(node: ir.Node):
    yield from (v for v in node.inputs if v is not None)
    if holds_graphs(node):
        from rewrite._shared.onnx_ir_nodes import subgraph_captures

        yield from subgraph_captures(node)


def _kahn(nodes: list[ir.Node], producers: Mapping[ir.Node, list[ir.Node]], key) -> list[ir.Node]:
    """Topological order of ``nodes``; among ready nodes the smallest ``key`` first."""
    waiting = {n: len(set(producers[n])) for n in nodes}
    users: dict[ir.Node, list[ir.Node]] = {n: [] for n in nodes}
    for node in nodes:
        for producer in set(producers[node]):
            users[producer].append(node)
    ready = [(key(n), i, n) for i, n in enumerate(nodes) if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, node = heapq.heappop(ready)
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (key(user), len(order) + len(nodes), user))
    if len(order) != len(nodes):  # pragma: no cover - members of a valid graph are acyclic
        raise ValueError("cycle among the members of a group")
    return order
