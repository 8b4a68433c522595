"""The AST of a rules file: frozen attrs records, each with the span it came from."""

from __future__ import annotations

from typing import Union

from attrs import field, frozen

from rewrite.lang.source import Span


# --- selectors -------------------------------------------------------------------------------


@frozen
class PathSelector:
    """``path h.*.attn``: a glob over the module path of a module call."""

    pattern: str
    span: Span = field(eq=False)


@frozen
class ClassSelector:
    """``class *GPT2Block``: a pattern over the qualified class name of a module call."""

    pattern: str
    span: Span = field(eq=False)


@frozen
class OpSelector:
    """``op aten.mm.*``: a glob over a node's op target."""

    pattern: str
    span: Span = field(eq=False)


@frozen
class TagSelector:
    """``stage == "encode"``, ``stage != "x"`` or ``has stage``."""

    key: str
    value: str | None
    """None for ``has key``."""
    negate: bool
    span: Span = field(eq=False)


MEASURES = ("size", "depth", "repeats", "call")
"""What a :class:`MeasureSelector` can compare (see docs/rules.md)."""

COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


@frozen
class MeasureSelector:
    """``size >= 100``, ``depth <= 2``, ``repeats >= 2``, ``call 0`` (``call == 0``): an
    integer comparison of what a module call is."""

    measure: str
    """One of :data:`MEASURES`."""
    op: str
    """One of :data:`COMPARISONS`."""
    value: int
    span: Span = field(eq=False)


@frozen
class AnySelector:
    """``any``: always true."""

    span: Span = field(eq=False)


@frozen
class NotSelector:
    operand: "Selector"
    span: Span = field(eq=False)


@frozen
class BoolSelector:
    """``a and b and c`` (op ``and``) or ``a or b`` (op ``or``)."""

    op: str
    operands: tuple["Selector", ...]
    span: Span = field(eq=False)


Selector = Union[PathSelector, ClassSelector, OpSelector, TagSelector, MeasureSelector,
                 AnySelector, NotSelector, BoolSelector]


# --- statements ------------------------------------------------------------------------------


@frozen
class Include:
    """``include "other.rules"``."""

    path: str
    span: Span = field(eq=False)


@frozen
class GroupRule:
    """``group SELECTOR [as "name"] [domain "domain"] [priority N]``."""

    selector: Selector
    span: Span = field(eq=False)
    name: str | None = None
    name_span: Span | None = field(default=None, eq=False)
    domain: str | None = None
    domain_span: Span | None = field(default=None, eq=False)
    priority: int = 0


@frozen
class FlatRule:
    """``flat SELECTOR [priority N]``: matching module calls are not groups."""

    selector: Selector
    span: Span = field(eq=False)
    priority: int = 0


@frozen
class Assignment:
    key: str
    value: str
    span: Span = field(eq=False)


@frozen
class TagRule:
    """``tag SELECTOR with key = "value", ...``: sets tags on the matching nodes."""

    selector: Selector
    assignments: tuple[Assignment, ...]
    span: Span = field(eq=False)
    priority: int = 0


@frozen
class SplitRule:
    """``split by KEY [order "a", "b"]``: one top-level component per value of tag KEY."""

    key: str
    order: tuple[str, ...]
    span: Span = field(eq=False)


CYCLE_POLICIES = ("error", "flatten")
"""What ``on cycle`` accepts."""


@frozen
class CyclePolicy:
    """``on cycle flatten`` / ``on cycle error``: what to do with a group that cannot be
    outlined (data leaves it and comes back)."""

    action: str
    """One of :data:`CYCLE_POLICIES`."""
    span: Span = field(eq=False)


Statement = Union[Include, GroupRule, FlatRule, TagRule, SplitRule, CyclePolicy]


@frozen
class RulesFile:
    """One parsed rules file (includes not yet resolved)."""

    statements: tuple[Statement, ...]
    name: str
