"""Why distinct: for each group identity lowered to more than one function, the first
difference between each variant's body and the first one's.

:func:`finishing._merge.merge_functions` decides which functions stay apart: bodies of one
identity whose structural keys (:meth:`outlining._body_keys.Keyer.body`, in canonical order)
differ. When it keeps a body apart it hands the body's key here (:meth:`Variants.add`), and the
key is compared with the key of the identity's first body, part by part, at the moment the
decision is made (before scalars are lifted): no second notion of "equal bodies".

The parts, in the order they are reported:

* the inputs' types and shapes (:meth:`outlining._body_keys.Keyer.types`), when the two bodies
  take as many inputs and their types differ as multisets (a reordering is not a difference):
  ``shape`` or ``dtype``, with the input names;
* the nodes (:meth:`outlining._body_keys.Keyer.node`: head, inputs, attributes). Canonical order
  is topological and, among ready nodes, sorted by a digest: after the first position where the
  keys differ, the two orders need not pair nodes that correspond. So the difference is looked
  for among the nodes that were *ready* there (all inputs read the equal prefix, arguments or
  constants): a node whose key has no equal among the other side's ready nodes, paired with
  the other side's unmatched ready node that reads the same inputs (then ``op``, ``subtree``:
  a call of another function, ``attribute``, ``constant``: a ``Constant`` node's value), or
  of the same op (``flow``: it reads other values); none: ``node`` (a node only one side has;
  for a ``Constant``, the node that reads it);
* the number of inputs (``inputs``) and the returned values (``outputs``).

The records are plain data (names, short value texts, function ids) and say themselves in
words (:meth:`Variant.reason`: ``Block_1 vs Block: op: Tanh at node_tanh vs Relu at
node_relu``), the one line ``explain --onnx`` (terminal, ``--json``, HTML) and a structure
diff (``rewrite verify``) print.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Mapping, Sequence

import onnx_ir as ir
from attrs import evolve, frozen

from rewrite.backends.onnx.summary import FunctionId, label

if TYPE_CHECKING:  # outlining imports this module (Outlined.variants)
    from rewrite.backends.onnx._keys import BodyKey, Key, NodeKey

Identity = tuple[str, str]
"""A group's ``(domain, base name)``: the functions made for it are one class."""

KINDS = ("shape", "dtype", "op", "subtree", "attribute", "constant", "flow", "node", "inputs",
         "outputs")
"""What a :class:`Difference` can be about (see the module docstring)."""

_MAX_ELEMENTS = 8


@frozen
class Side:
    """One body's side of a difference."""

    node: str | None
    """The node (its name, else ``Op#position``) or the input (its name) that differs; None
    when this side has no such node."""
    value: str
    """What it is on this side: an op, an attribute's or constant's value, a type."""
    function: FunctionId | None = None
    """``subtree``: the function this node calls."""

    def text(self) -> str:
        """Its value and where (``Relu at node_relu``, ``calls pkg::MLP at h.0/mlp``)."""
        value = f"calls {label(self.function)}" if self.function else self.value
        return f"{value} at {self.node}" if self.node else value


@frozen
class Difference:
    """The first difference between two bodies of one identity."""

    kind: str
    """One of :data:`KINDS`."""
    what: str
    """The attribute, input or output it is about (``epsilon``, ``x``, ``input 1``); ``""``
    when the kind says it all."""
    first: Side
    """The first function's side."""
    other: Side
    """The variant's side."""

    def about(self) -> str:
        """What it is about: ``op``, ``shape of x``, ``attribute epsilon``."""
        return _ABOUT[self.kind].format(what=self.what or "it")


_ABOUT = {
    "shape": "shape of {what}",
    "dtype": "dtype of {what}",
    "op": "op",
    "subtree": "a different group subtree",
    "attribute": "attribute {what}",
    "constant": "constant value",
    "flow": "{what} reads",
    "node": "a node only one of them has",
    "inputs": "number of inputs",
    "outputs": "{what}",
}
"""How :meth:`Difference.about` words each of :data:`KINDS`."""


@frozen
class Variant:
    """A function of an identity beside its first, and why it is not the first."""

    identity: Identity
    function: FunctionId
    first: FunctionId
    difference: Difference

    def reason(self) -> str:
        """``Block_1 vs Block: op: Tanh at node_tanh vs Relu at node_relu``."""
        diff = self.difference
        return (f"{self.function[1]} vs {self.first[1]}: {diff.about()}: "
                f"{diff.other.text()} vs {diff.first.text()}")


@frozen
class _Body:
    function: FunctionId
    key: "BodyKey"
    nodes: list[ir.Node]
    inputs: list[ir.Value]


class Variants:
    """Told of every body :func:`finishing._merge.merge_functions` keeps apart; :attr:`found`
    holds a :class:`Variant` for each one beside the first of its identity."""

    def __init__(self, functions: Mapping[FunctionId, ir.Function]) -> None:
        self._functions = functions
        self._first: dict[Identity, _Body] = {}
        self.found: list[Variant] = []

    def add(self, identity: Identity, function: FunctionId, key: "BodyKey", nodes: list[ir.Node],
            inputs: list[ir.Value]) -> None:
        """A body with a key no earlier body of ``identity`` has (``nodes`` and ``inputs`` in
        the key's order)."""
        body = _Body(function, key, nodes, inputs)
        first = self._first.setdefault(identity, body)
        if first is not body:
            self.found.append(Variant(identity, function, first.function,
                                      _difference(first, body, self._functions)))

    def renamed(self, renamed: Mapping[FunctionId, FunctionId]) -> tuple[Variant, ...]:
        """:attr:`found` with the ids merging renumbered replaced by the new ones."""
        def fid(f: FunctionId | None) -> FunctionId | None:
            return renamed.get(f, f) if f is not None else None

        def side(s: Side) -> Side:
            return evolve(s, function=fid(s.function)) if s.function else s

        return tuple(
            evolve(v, function=fid(v.function), first=fid(v.first),
                   difference=evolve(v.difference, first=side(v.difference.first),
                                     other=side(v.difference.other)))
            for v in self.found
        )


def _difference(a: _Body, b: _Body, functions: Mapping[FunctionId, ir.Function]
                ) -> Difference:
    a_nodes, a_returned, a_types = a.key.nodes, a.key.returned, a.key.types
    b_nodes, b_returned, b_types = b.key.nodes, b.key.returned, b.key.types
    if len(a_types) == len(b_types) and Counter(a_types) != Counter(b_types):
        return _types(a, b)
    found = _nodes(a, b, functions)
    if found is not None:
        return found
    if len(a_types) != len(b_types):
        return Difference("inputs", "", Side(None, f"{len(a_types)} inputs"),
                          Side(None, f"{len(b_types)} inputs"))
    if a_types != b_types:  # the same types, in another order
        return Difference("inputs", "order", Side(None, _names(a.inputs)),
                          Side(None, _names(b.inputs)))
    k = next((k for k, (x, y) in enumerate(zip(a_returned, b_returned)) if x != y),
             min(len(a_returned), len(b_returned)))
    return Difference("outputs", f"output {k}",
                      Side(None, _returned(a_returned, k, a.nodes)),
                      Side(None, _returned(b_returned, k, b.nodes)))


def _types(a: _Body, b: _Body) -> Difference:
    """The first input of ``b`` whose type ``a`` lacks, beside ``a``'s at the same place (or
    its first input of a type ``b`` lacks)."""
    a_types, b_types = a.key.types, b.key.types
    missing_in_a = Counter(b_types) - Counter(a_types)
    missing_in_b = Counter(a_types) - Counter(b_types)
    k = next(k for k, t in enumerate(b_types) if t in missing_in_a)
    i = k if a_types[k] in missing_in_b else next(
        i for i, t in enumerate(a_types) if t in missing_in_b)
    x, y = a.inputs[i], b.inputs[k]
    kind = "dtype" if x.dtype != y.dtype else "shape"
    what = x.name if x.name == y.name else f"input {k}"
    return Difference(kind, what or f"input {k}", Side(x.name, _type(x)), Side(y.name, _type(y)))


def _nodes(a: _Body, b: _Body, functions: Mapping[FunctionId, ir.Function]
           ) -> Difference | None:
    a_keys, b_keys = a.key.nodes, b.key.nodes
    j = next((j for j, (x, y) in enumerate(zip(a_keys, b_keys)) if x != y),
             min(len(a_keys), len(b_keys)))
    if j == len(a_keys) == len(b_keys):
        return None
    ready_a = [i for i in range(j, len(a_keys)) if _ready(a_keys[i], j)]
    ready_b = [i for i in range(j, len(b_keys)) if _ready(b_keys[i], j)]
    alone_a = _unmatched(ready_a, a_keys, ready_b, b_keys)
    alone_b = _unmatched(ready_b, b_keys, ready_a, a_keys)
    if alone_b:  # the variant's node first: it says what the variant has instead
        k = alone_b[0]
        i = _counterpart(b_keys[k], alone_a, a_keys)
        return _pair(a.nodes, i, b.nodes, k, a_keys, b_keys, functions)
    if alone_a:
        i = alone_a[0]
        return _pair(a.nodes, i, b.nodes, _counterpart(a_keys[i], [], b_keys), a_keys,
                     b_keys, functions)
    return None  # pragma: no cover - keys differ at j: some ready node differs


def _ready(key: "NodeKey", j: int) -> bool:
    """Whether a node with ``key`` reads only arguments, constants and the first ``j``
    members (``(member, output)`` references, see :meth:`outlining._body_keys.Keyer.refs`)."""
    return all(not _member_ref(ref) or ref[0] < j for ref in key.inputs)


def _member_ref(ref: Key) -> bool:
    return isinstance(ref, tuple) and len(ref) == 2 and type(ref[0]) is int


def _unmatched(mine: list[int], my_keys: Sequence["NodeKey"], theirs: list[int],
               their_keys: Sequence["NodeKey"]) -> list[int]:
    """``mine`` whose keys are not among ``theirs``' (counted: two equal nodes need two)."""
    left = Counter(their_keys[i] for i in theirs)
    alone = []
    for i in mine:
        if left[my_keys[i]]:
            left[my_keys[i]] -= 1
        else:
            alone.append(i)
    return alone


def _counterpart(key: "NodeKey", candidates: list[int], keys: Sequence["NodeKey"]) -> int | None:
    """Among ``candidates``, the node reading the same inputs (the same op first), else the
    first of the same op; None when there is none."""
    same_inputs = [i for i in candidates if keys[i].inputs == key.inputs]
    for i in same_inputs:
        if keys[i].head == key.head:
            return i
    if same_inputs:
        return same_inputs[0]
    return next((i for i in candidates if keys[i].head == key.head), None)


def _pair(a_nodes: list[ir.Node], i: int | None, b_nodes: list[ir.Node], k: int | None,
          a_keys: Sequence["NodeKey"], b_keys: Sequence["NodeKey"],
          functions: Mapping[FunctionId, ir.Function]) -> Difference:
    """What differs between node ``i`` of the first body and node ``k`` of the variant
    (one of them None: a node only the other side has)."""
    if i is None or k is None:
        side_a = _op_side(a_nodes, _reader(a_nodes, i), functions) if i is not None \
            else Side(None, "(none)")
        side_b = _op_side(b_nodes, _reader(b_nodes, k), functions) if k is not None \
            else Side(None, "(none)")
        return Difference("node", "", side_a, side_b)
    x, y = a_nodes[i], b_nodes[k]
    kx, ky = a_keys[i], b_keys[k]
    if kx.head != ky.head:
        side_a, side_b = _op_side(a_nodes, i, functions), _op_side(b_nodes, k, functions)
        kind = "subtree" if side_a.function and side_b.function else "op"
        return Difference(kind, "", side_a, side_b)
    if kx.inputs != ky.inputs:
        n = next((n for n, (u, v) in enumerate(zip(kx.inputs, ky.inputs)) if u != v), 0)
        return Difference("flow", f"input {n}", Side(_name(x, i), _read(x, n)),
                          Side(_name(y, k), _read(y, n)))
    attrs_x, attrs_y = dict(kx.attributes), dict(ky.attributes)
    name = next(n for n in sorted(attrs_x.keys() | attrs_y.keys())
                if attrs_x.get(n) != attrs_y.get(n))
    kind = "constant" if x.op_type == "Constant" and x.domain == "" else "attribute"
    return Difference(kind, name, Side(_name(x, i), _attribute(x, name)),
                      Side(_name(y, k), _attribute(y, name)))


def _reader(nodes: list[ir.Node], i: int) -> int:
    """``i``, or for a ``Constant`` the body's first node that reads it (a constant only one
    body has is there for the node that reads it: that node says more)."""
    node = nodes[i]
    if node.op_type != "Constant" or node.domain != "":
        return i
    readers = {use.node for use in node.outputs[0].uses()}
    return next((j for j, other in enumerate(nodes) if other in readers), i)


def _name(node: ir.Node, position: int) -> str:
    return node.name or f"{node.op_type}#{position}"


def _op_side(nodes: list[ir.Node], i: int, functions: Mapping[FunctionId, ir.Function]
             ) -> Side:
    node = nodes[i]
    fid = (node.domain, node.op_type, node.overload)
    op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    if len(node.outputs) != 1:
        op += f" ({len(node.outputs)} outputs)"
    return Side(_name(node, i), op, fid if fid in functions else None)


def _read(node: ir.Node, n: int) -> str:
    value = node.inputs[n] if n < len(node.inputs) else None
    if value is None:
        return "(nothing)"
    producer = value.producer()
    if producer is None:
        return value.name or "an input"
    return f"{value.name or 'an output'} of {producer.name or producer.op_type}"


def _attribute(node: ir.Node, name: str) -> str:
    attr = node.attributes.get(name)
    if attr is None:
        return "(not set)"
    if attr.is_ref():
        return f"@{attr.ref_attr_name}"
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        return _tensor(value)
    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return "a subgraph"
    text = repr(list(value)) if isinstance(value, Sequence) and not isinstance(value, str) \
        else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tensor(tensor: ir.TensorProtocol) -> str:
    described = _dtype(tensor.dtype) + (_dims(tensor.shape) if tensor.shape.rank() else "")
    if tensor.size > _MAX_ELEMENTS:
        return described
    values = tensor.numpy().reshape(-1).tolist()
    shown = values[0] if tensor.shape.rank() == 0 else values
    return f"{shown!r} ({described})"


def _type(value: ir.Value) -> str:
    if value.dtype is None:
        return str(value.type)
    return _dtype(value.dtype) + (_dims(value.shape) if value.shape is not None else "[?]")


def _dtype(dtype: ir.DataType) -> str:
    return dtype.name.lower()


def _dims(shape: ir.Shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(values: list[ir.Value]) -> str:
    return ", ".join(v.name or "?" for v in values)


def _returned(returned: Sequence[Key], k: int, nodes: list[ir.Node]) -> str:
    if k >= len(returned):
        return f"{len(returned)} outputs"
    ref = returned[k]
    if _member_ref(ref):
        return f"output {ref[1]} of {_name(nodes[ref[0]], ref[0])}"
    if isinstance(ref, tuple) and ref and ref[0] == "arg":
        return f"input {ref[1]}"
    return "a constant"
