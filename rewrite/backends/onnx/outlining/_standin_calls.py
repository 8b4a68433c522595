"""How stand-ins are planned: a stand-in's group becomes a call of the function its first
call's group got.

When a first call's group is outlined, its arguments and outputs are recorded by position in
the torch call (:class:`Positions`, read through the template of its inlined nodes, the
values outlining replaced followed). A stand-in's call then picks its own inputs and outputs
at those positions (:meth:`StandIns.call`); when that is not exactly what outlining its
inlined nodes would give, the call is marked failed (the lowering inlines it and runs again).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx._standins import Reuse
from rewrite.backends.onnx.outlining._body_keys import Key
from rewrite.grouping import Group


@frozen
class Positions:
    """A first call's group, by position in the torch call."""

    arg_at: tuple[int, ...]
    """Per argument of its function, the torch call's input it is."""
    out_at: tuple[int, ...]
    """Per output of its function, the torch call's output it is."""
    embedded: tuple[Key | None, ...]
    """Per input of the torch call, the key of the constant embedded for it (None: an
    argument, or unread)."""


@frozen
class FirstCall:
    """The function a first call's group calls, and where its stand-ins find its values."""

    function: ir.Function
    positions: Positions


@frozen
class StandInCall:
    """What replaces a stand-in: a call of ``function`` with these arguments and outputs."""

    function: ir.Function
    args: list[ir.Value]
    outputs: list[ir.Value]


class StandIns:
    """The plan's stand-ins, the first calls' functions as outlining makes them, and the
    calls that could not stand in."""

    def __init__(self, reuses: Mapping[int, Reuse], current: Callable[[ir.Value], ir.Value],
                 constant_key: Callable[[ir.Value], Key | None]) -> None:
        self.reuses = reuses
        """By the stand-in's group id."""
        self.templates = {r.first_group: r.template for r in reuses.values()}
        """By the first call's group id."""
        self.current = current
        self.constant_key = constant_key
        self.first_calls: dict[int, FirstCall | None] = {}
        """Per first call's group: its function and positions (None: stand-ins cannot call
        it)."""
        self.failed: set[int] = set()
        """The calls (per-body call indices) that could not stand in."""

    def positions(self, group: Group, args: list[ir.Value], outputs: list[ir.Value]
                  ) -> Positions | None:
        """For a first call's group (its outputs not yet rewired): its arguments and outputs
        by position in the torch call and the constants it embeds; None when they are not
        all the call's, or ``group`` is no first call's."""
        template = self.templates.get(group.index)
        if template is None:
            return None
        inputs = [self.current(v) if v is not None else None for v in template.inputs]
        at = {v: p for p, v in enumerate(inputs) if v is not None}
        made = {self.current(v): j for j, v in enumerate(template.outputs) if v is not None}
        arg_at, out_at = [at.get(v) for v in args], [made.get(v) for v in outputs]
        if None in arg_at or None in out_at:
            return None
        return Positions(tuple(arg_at), tuple(out_at),  # type: ignore[arg-type]
                         self._embedded_keys(inputs))

    def note_first(self, group: Group, function: ir.Function, positions: Positions | None
                   ) -> None:
        """``group`` (if a first call's) calls ``function``."""
        if group.index in self.templates:
            self.first_calls[group.index] = (FirstCall(function, positions)
                                             if positions is not None else None)

    def call(self, reuse: Reuse, only_member: bool) -> StandInCall | None:
        """The call that replaces ``reuse``'s stand-in (the one member of its group when
        ``only_member``), or None (the call marked failed)."""
        node = reuse.node
        found = self.first_calls.get(reuse.first_group)
        if found is None or not only_member or len(set(node.inputs)) != len(node.inputs):
            self.failed.add(reuse.call)
            return None
        out_at = found.positions.out_at
        used = {j for j, v in enumerate(node.outputs) if v.uses() or v.is_graph_output()}
        read = [v if t is not None else None for v, t in zip(node.inputs, reuse.template.inputs)]
        if used != set(out_at) or len(out_at) != len(used) \
                or self._embedded_keys(read) != found.positions.embedded:
            self.failed.add(reuse.call)
            return None
        args = [node.inputs[p] for p in found.positions.arg_at]
        outputs = [node.outputs[j] for j in out_at]  # type: ignore[index]
        return StandInCall(found.function, args, outputs)  # type: ignore[arg-type]

    def _embedded_keys(self, values: Sequence[ir.Value | None]) -> tuple[Key | None, ...]:
        """Per value, the key of the constant embedded for it (None: an argument, or unread)."""
        return tuple(self.constant_key(v) if v is not None else None for v in values)
