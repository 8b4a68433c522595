"""The structural keys of ONNX function bodies, as data: what outlining computes
(:class:`~rewrite.backends.onnx.outlining.Keyer`), finishing merges by and :mod:`distinct`
compares. Shared by those stages, so it sits at the backend's top level."""

from __future__ import annotations

from typing import Hashable, Mapping, NamedTuple

Key = Hashable
Refs = Mapping[int, Key]
"""``id(value)`` -> how the body refers to it."""


class NodeKey(NamedTuple):
    """A member's key: ``Keyer.head`` (domain, op, overload, number of outputs), then what it
    reads (``Keyer.input`` per input) and its attributes (sorted ``(name, key)``); ``Keyer``
    is :class:`rewrite.backends.onnx.outlining.Keyer`."""

    domain: str
    op_type: str
    overload: str
    outputs: int
    inputs: tuple
    attributes: tuple

    @property
    def head(self) -> tuple[str, str, str, int]:
        """:meth:`~rewrite.backends.onnx.outlining.Keyer.head` of the node."""
        return (self.domain, self.op_type, self.overload, self.outputs)


class BodyKey(NamedTuple):
    """A function body's key (:meth:`~rewrite.backends.onnx.outlining.Keyer.body`)."""

    identity: tuple[str, str]
    """The group's domain and base name."""
    nodes: tuple[NodeKey, ...]
    """The members' keys, in member order."""
    returned: tuple
    """How the body refers to each value it returns."""
    types: tuple[tuple[str, str], ...]
    """:meth:`~rewrite.backends.onnx.outlining.Keyer.types` of its inputs."""
