"""Repeated blocks: recognise a body equal, *in graph order*, to one already outlined.

Canonicalizing a body (:meth:`Keyer.canonical_order`) and keying it costs more than checking
that it repeats an earlier one: the 2nd..Nth of N identical blocks list their members, args
and outputs in graph order exactly like the 1st, so they can reuse its function and its
permutations into canonical order. Each body that got a function is kept as a
:class:`Reference` (taken before outlining moves its nodes); a later body is compared node by
node with the references of its class (group identity and sizes), stopping at the first
difference. Equal here means equal :meth:`Keyer.body` keys of the raw (graph-order) bodies:
same ops, overloads, attributes, flow between members, which argument or embedded constant
each input reads, same outputs, same argument types and shapes.
"""

from __future__ import annotations

from typing import Mapping

import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx.structure import Key, Keyer

_SCALARS = (ir.AttributeType.INT, ir.AttributeType.STRING)
_LISTS = (ir.AttributeType.INTS, ir.AttributeType.STRINGS)
_FLOAT, _TENSOR = ir.AttributeType.FLOAT, ir.AttributeType.TENSOR
_PLAIN = (int, str)

Op = tuple[str, str, str, int]
"""``(domain, op_type, overload, number of outputs)``."""


@frozen
class Step:
    """One member of a reference body."""

    op: Op
    inputs: tuple[Key, ...]
    """How each input is referred to (see :func:`_codes`)."""
    attributes: Mapping[str, ir.Attr]


Class = tuple[tuple[str, str], int, int, int]
"""Group identity ``(domain, name)`` and the numbers of members, args and outputs."""


@frozen
class Body:
    """A body in graph order, as :meth:`Repeats.find` compares it."""

    cls: Class
    steps: tuple[Step, ...]
    returned: tuple[Key, ...]
    types: tuple[tuple[str, str], ...]


@frozen
class Reference:
    """A body that has a function, and how to call that function."""

    body: Body
    function: ir.Function
    member_order: list[int]
    """Canonical member order, as positions in graph order (likewise args and outputs)."""
    arg_order: list[int]
    output_order: list[int]


def _op(node: ir.Node) -> Op:
    return (node.domain, node.op_type, node.overload, len(node.outputs))


def _codes(members: list[ir.Node], args: list[ir.Value],
           constants: Mapping[ir.Value, Key]) -> dict[ir.Value, Key]:
    """How the body refers to values: ``("arg", k)``, a constant's key, ``(member, output)``
    (values from elsewhere are ``("outer", name)``, as in :meth:`Keyer.body`)."""
    codes: dict[ir.Value, Key] = {v: ("arg", k) for k, v in enumerate(args)}
    codes.update(constants)
    for j, node in enumerate(members):
        for t, value in enumerate(node.outputs):
            codes[value] = (j, t)
    return codes


def _types(args: list[ir.Value]) -> tuple[tuple[str, str], ...]:
    return tuple((str(v.type), str(v.shape)) for v in args)


class Repeats:
    """References by class: ``snapshot`` a body, ``add`` it with its function, ``find``."""

    def __init__(self, keyer: Keyer) -> None:
        self._keyer = keyer
        self._references: dict[Class, list[Reference]] = {}

    @staticmethod
    def snapshot(identity: tuple[str, str], members: list[ir.Node], args: list[ir.Value],
                 constants: Mapping[ir.Value, Key], outputs: list[ir.Value]) -> Body:
        """The body as it is now (outlining then moves and rewires its nodes)."""
        codes = _codes(members, args, constants)
        steps = tuple(
            Step(_op(node), tuple(_code(codes, v) for v in node.inputs),
                 dict(_attribute_dict(node)))
            for node in members
        )
        return Body((identity, len(members), len(args), len(outputs)), steps,
                    tuple(codes[v] for v in outputs), _types(args))

    def add(self, reference: Reference) -> None:
        self._references.setdefault(reference.body.cls, []).append(reference)

    def find(self, identity: tuple[str, str], members: list[ir.Node], args: list[ir.Value],
             constants: Mapping[ir.Value, Key], outputs: list[ir.Value]) -> Reference | None:
        """The reference this body (members, args, outputs in graph order) repeats, if any."""
        found = self._references.get((identity, len(members), len(args), len(outputs)))
        if not found:
            return None
        codes = _codes(members, args, constants)
        types: tuple | None = None
        for reference in found:
            body = reference.body
            if not self._same_steps(body.steps, members, codes):
                continue
            if tuple(codes[v] for v in outputs) != body.returned:
                continue
            types = _types(args) if types is None else types
            if types == body.types:
                return reference
        return None

    def _same_steps(self, steps: tuple[Step, ...], members: list[ir.Node],
                    codes: dict[ir.Value, Key]) -> bool:
        get = codes.get
        for node, step in zip(members, steps):
            if _op(node) != step.op:
                return False
            inputs = node.inputs
            expected = step.inputs
            if len(inputs) != len(expected):
                return False
            for value, code in zip(inputs, expected):
                if value is None:
                    if code is not None:
                        return False
                elif (get(value) or ("outer", value.name)) != code:
                    return False
            attributes = node.attributes
            attributes = getattr(attributes, "data", attributes)
            theirs = step.attributes
            if attributes or theirs:
                if len(attributes) != len(theirs):
                    return False
                for name, attr in attributes.items():
                    other = theirs.get(name)
                    if other is None or not (attr is other or self._same_attribute(attr, other)):
                        return False
        return True

    def _same_attribute(self, attr: ir.Attr, other: ir.Attr) -> bool:
        """Whether the two attributes have equal keys (:meth:`Keyer.attribute`)."""
        kind = attr.type
        if kind is not other.type or attr.is_ref() or other.is_ref():
            return self._keyer.attribute(attr, {}, 0) == self._keyer.attribute(other, {}, 0)
        mine, theirs = attr.value, other.value
        if kind in _LISTS:
            return tuple(mine) == tuple(theirs)
        if kind in _SCALARS and type(mine) in _PLAIN:
            return type(mine) is type(theirs) and mine == theirs
        if kind is _FLOAT:
            return float(mine).hex() == float(theirs).hex()
        if kind is _TENSOR:
            return mine is theirs or self._keyer.tensor(mine) == self._keyer.tensor(theirs)
        return self._keyer.attribute(attr, {}, 0) == self._keyer.attribute(other, {}, 0)


def _code(codes: Mapping[ir.Value, Key], value: ir.Value | None) -> Key:
    if value is None:
        return None
    return codes.get(value) or ("outer", value.name)


def _attribute_dict(node: ir.Node) -> Mapping[str, ir.Attr]:
    attributes = node.attributes
    return getattr(attributes, "data", attributes)  # the UserDict's dict: faster
