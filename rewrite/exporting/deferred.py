"""Conditions on a dynamic size that torch.export cannot prove, deferred to run time and
proved here.

torch.export refuses a model whose code holds only where a condition on a dynamic size holds
and its reasoning cannot show that it holds for every length (Aria's experts:
``sequence_length*min(64, 64*sequence_length) == 64*sequence_length``, true for every
length). Exported again with ``prefer_deferred_runtime_asserts_over_guards`` (one place:
:func:`rewrite.exporting.module._torch_export`), each such condition is a runtime assert of
the program, which the ONNX model does not keep. So the program stands in only where every
condition on one size holds over that size's whole exported range (:func:`unproven`):
checked at each length up to :data:`CHECKED` past the shortest, and proved by sympy for the
longer ones (the length written ``first + k``, ``k`` any nonnegative integer). The retry is
made only where torch.export's refusal named conditions on one size each (:func:`deferrable`);
a condition tying sizes together (a mask as long as the past and the new tokens) is the
model's input contract, which torch.export would have accepted or refused the same way.

A condition true from the shortest length up to some length and false just past it
(OpenAI-GPT's ``sequence_length != 128`` under torch.export's bound ``<= 128``: its causal
mask sliced from a 128 x 128 buffer is contiguous at 128 only; MPT's at its 2048 positions)
bounds the size: :attr:`Unproven.bounds` gives the bound, within which the model is exported again
(:class:`~rewrite.exporting.bounds.Bounded`), as for a bound torch.export suggests.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from attrs import frozen

from rewrite.errors import InputError

if TYPE_CHECKING:
    import torch

CHECKED = 1024
"""How many lengths past the shortest each deferred condition is evaluated at."""

CONSTANTS = 8 * CHECKED
"""The largest constant of a condition up to which it is evaluated at each length when sympy
cannot prove it past :data:`CHECKED` (DeepSeek-V3.2's ``Min(2048, sequence_length) <=
sequence_length``: past its constants, a ``Min`` or ``Max`` of them is decided)."""


class Deferrable(InputError):
    """torch.export's refusal of a model whose code holds for some values of dynamic sizes
    only, each condition on one size (:func:`deferrable`): worth exporting again with the
    conditions deferred to run time."""


def deferrable(message: str) -> bool:
    """Whether torch.export's "Constraints violated" ``message`` lists conditions on one
    dynamic size each ("Not all values of ... satisfy the generated guard ...") and nothing
    else but the value its solver of those conditions would fix a size to ("solving the
    guards ... resulted in a specialized value": ProphetNet's ``(4*s - 1) // s == 3``, which
    it cannot solve; a retry that must fix the size is refused all the same)."""
    lines = [line.strip() for line in message.splitlines() if line.startswith("  - ")]
    guards = [line for line in lines
              if re.match(r"- Not all values of .+ satisfy the generated guard ", line)]
    return bool(guards) and all(
        line in guards or re.match(r"- solving the guards generated for .+ resulted in a "
                                   r"specialized value of \d+\.$", line)
        for line in lines)


@frozen
class Unproven:
    """Why a program's runtime conditions on one size each do not all hold over its range
    (:func:`unproven`)."""

    why: str
    """The first failing condition, in words naming its size."""
    bounds: dict[str, int]
    """Where every failing condition is true from its size's smallest value up to some
    length, each checked, and false just past it (OpenAI-GPT's ``!= 128`` at torch.export's
    bound 128; MPT's at its 2048 positions): each such size's name and the last length where
    its conditions hold (at least 2: a prompt stays possible), the bound within which the
    model is exported; empty otherwise (a condition false at the shortest, not proved, or
    not evaluated)."""


def unproven(program: "torch.export.ExportedProgram", names: Mapping[str, str]
             ) -> Unproven | None:
    """Why ``program``'s runtime conditions on one size each do not hold over its range,
    and the bounds within which they do, each condition evaluated once (``names``: a
    symbol's ``Dim`` name); None when they all hold."""
    failing = []
    for condition, symbol, low, high in _conditions(program):
        found = _failing(condition, symbol, low, high)
        if found is not None:
            failing.append((condition, symbol, low, found))
    if not failing:
        return None
    condition, symbol, _, first = failing[0]
    name = names.get(symbol.name, symbol.name)
    shown = re.sub(rf"\b{symbol.name}\b", name, str(condition))
    why = f"deferred to run time, {shown} {first.words.replace('{}', name)}"
    bounds: dict[str, int] = {}
    for _, symbol, low, found in failing:
        if found.first_false is None or found.first_false - 1 < max(low, 2):
            return Unproven(why, {})
        name = names.get(symbol.name, symbol.name)
        bounds[name] = min(bounds.get(name, found.first_false), found.first_false - 1)
    return Unproven(why, bounds)


def _conditions(program: "torch.export.ExportedProgram"
                ) -> list[tuple[Any, Any, int, int | None]]:
    """``program``'s runtime conditions on one dynamic size each, once each: (condition,
    its size's symbol, the size's smallest and largest value, None where unbounded)."""
    import sympy

    from rewrite._private.torch_graphs import runtime_conditions

    ranges = program.range_constraints
    found, seen = [], set()
    for condition in runtime_conditions(program):
        symbols = condition.free_symbols
        if condition in seen or len(symbols) != 1:
            continue
        seen.add(condition)
        symbol = next(iter(symbols))
        if symbol not in ranges or not re.fullmatch(r"s\d+", symbol.name):
            continue  # a data-dependent size's: asserted as in any export
        bounds = ranges[symbol]
        high = int(bounds.upper) if isinstance(bounds.upper, sympy.Integer) else None
        found.append((condition, symbol, int(bounds.lower), high))
    return found


@frozen
class _Failing:
    """Where a condition fails: in ``words`` (``{}`` for the size's name), and the first
    value where it is false, every value before it true (None: not proved, or not
    evaluated)."""

    words: str
    first_false: int | None = None


def _failing(condition: Any, symbol: Any, low: int, high: int | None) -> _Failing | None:
    """Where ``condition`` fails for ``symbol`` from ``low`` to ``high`` (None: unbounded),
    None when it holds for every value."""
    import sympy

    last = low + CHECKED if high is None else min(high, low + CHECKED)
    why = _false_at(condition, symbol, low, last)
    if why is not None or (high is not None and last == high):
        return why
    if _proved(condition, symbol, last + 1):
        return None
    largest = max((abs(int(c)) for c in condition.atoms(sympy.Integer)), default=0)
    if last < largest <= CONSTANTS:  # past its constants, where sympy may decide it
        end = largest + 1 if high is None else min(high, largest + 1)
        why = _false_at(condition, symbol, last + 1, end)
        if why is not None or (high is not None and end == high):
            return why
        if _proved(condition, symbol, end + 1):
            return None
        last = end
    return _Failing(f"cannot be proved for {{}} > {last} (true up to it)")


def _false_at(condition: Any, symbol: Any, first: int, last: int) -> _Failing | None:
    """Where ``condition`` is false for ``symbol`` from ``first`` to ``last``, each
    evaluated; None where it is true at all."""
    import sympy

    for value in range(first, last + 1):
        try:
            holds = condition.subs(symbol, value) is sympy.true
        except (ZeroDivisionError, TypeError, ValueError) as e:  # torch's Mod by zero
            return _Failing(f"cannot be evaluated at {{}} = {value} ({type(e).__name__}: {e})")
        if not holds:
            return _Failing(f"is false at {{}} = {value}", value)
    return None


def _proved(condition: Any, symbol: Any, first: int) -> bool:
    """Whether sympy proves ``condition`` for every integer value of ``symbol`` from
    ``first`` on."""
    import sympy

    from rewrite._private.torch_graphs import standard_sympy

    k = sympy.Dummy("k", integer=True, nonnegative=True)
    tail = standard_sympy(condition.subs(symbol, first + k))
    if tail is sympy.true:
        return True
    try:
        return sympy.simplify(tail) is sympy.true
    except (TypeError, ValueError, NotImplementedError):  # sympy gives up
        return False
