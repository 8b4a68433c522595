"""Repeated blocks: recognise a body equal, *in graph order*, to one already outlined.

Canonicalizing a body (:func:`_body_keys.canonical_order`) and keying it costs more than checking
that it repeats an earlier one: the 2nd..Nth of N identical blocks list their members, args
and outputs in graph order exactly like the 1st, so they can reuse its function and its
permutations into canonical order. Each body that got a function is kept as a
:class:`Reference` (taken before outlining moves its nodes); a later body is compared node by
node with the references of its class (group identity and sizes), stopping at the first
difference. Equal here means equal :meth:`Keyer.body` keys of the raw (graph-order) bodies,
compared through the Keyer's own parts (there is one definition of "identical body", in
:mod:`outlining._body_keys`): same ops, overloads, attributes, flow between members, which argument
or embedded constant each input reads, same outputs, same argument types and shapes.
"""

from __future__ import annotations

from typing import Mapping

import onnx_ir as ir
from attrs import frozen

from rewrite._private.onnx_ir_attrs import attribute_dict
from rewrite.backends.onnx.outlining._body_keys import Key, Keyer, Refs


@frozen
class Step:
    """One member of a reference body."""

    op: tuple[str, str, str, int]
    """:meth:`Keyer.head` of the member."""
    inputs: tuple[Key, ...]
    """How each input is referred to (:meth:`Keyer.input`)."""
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


class Repeats:
    """References by class: ``snapshot`` a body, ``add`` it with its function, ``find``."""

    def __init__(self, keyer: Keyer) -> None:
        self._keyer = keyer
        self._references: dict[Class, list[Reference]] = {}

    def snapshot(self, identity: tuple[str, str], members: list[ir.Node], args: list[ir.Value],
                 constants: Mapping[ir.Value, Key], outputs: list[ir.Value]) -> Body:
        """The body as it is now (outlining then moves and rewires its nodes)."""
        keyer = self._keyer
        refs = keyer.refs(members, args, constants)
        steps = tuple(
            Step(keyer.head(node), tuple(keyer.input(v, refs) for v in node.inputs),
                 dict(attribute_dict(node)))
            for node in members
        )
        return Body((identity, len(members), len(args), len(outputs)), steps,
                    tuple(refs[id(v)] for v in outputs), keyer.types(args))

    def add(self, reference: Reference) -> None:
        self._references.setdefault(reference.body.cls, []).append(reference)

    def find(self, identity: tuple[str, str], members: list[ir.Node], args: list[ir.Value],
             constants: Mapping[ir.Value, Key], outputs: list[ir.Value]) -> Reference | None:
        """The reference this body (members, args, outputs in graph order) repeats, if any."""
        found = self._references.get((identity, len(members), len(args), len(outputs)))
        if not found:
            return None
        refs = self._keyer.refs(members, args, constants)
        types: tuple | None = None
        for reference in found:
            body = reference.body
            if not self._same_steps(body.steps, members, refs):
                continue
            if tuple(refs[id(v)] for v in outputs) != body.returned:
                continue
            types = self._keyer.types(args) if types is None else types
            if types == body.types:
                return reference
        return None

    def _same_steps(self, steps: tuple[Step, ...], members: list[ir.Node], refs: Refs) -> bool:
        """Whether each member's :meth:`Keyer.node` key equals its step's (early exit)."""
        keyer = self._keyer
        head, reference, same_attribute = keyer.head, keyer.input, keyer.same_attribute
        for node, step in zip(members, steps):
            if head(node) != step.op:
                return False
            inputs = node.inputs
            expected = step.inputs
            if len(inputs) != len(expected):
                return False
            for value, code in zip(inputs, expected):
                if reference(value, refs) != code:
                    return False
            attributes = attribute_dict(node)
            theirs = step.attributes
            if attributes or theirs:
                if len(attributes) != len(theirs):
                    return False
                for name, attr in attributes.items():
                    other = theirs.get(name)
                    if other is None or not same_attribute(attr, other):
                        return False
        return True


