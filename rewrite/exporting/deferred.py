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
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from rewrite.errors import InputError

if TYPE_CHECKING:
    import torch

CHECKED = 1024
"""How many lengths past the shortest each deferred condition is evaluated at."""


class Deferrable(InputError):
    """torch.export's refusal of a model whose code holds for some values of dynamic sizes
    only, each condition on one size (:func:`deferrable`): worth exporting again with the
    conditions deferred to run time."""


def deferrable(message: str) -> bool:
    """Whether torch.export's "Constraints violated" ``message`` lists conditions on one
    dynamic size each ("Not all values of ... satisfy the generated guard ...") and nothing
    else."""
    lines = [line.strip() for line in message.splitlines() if line.startswith("  - ")]
    return bool(lines) and all(
        re.match(r"- Not all values of .+ satisfy the generated guard ", line)
        for line in lines)


def unproven(program: "torch.export.ExportedProgram", names: Mapping[str, str]) -> str | None:
    """Why ``program``'s runtime conditions on one size each do not hold over its range, in
    words naming the size (``names``: a symbol's ``Dim`` name); None when they all hold."""
    from rewrite._private.torch_graphs import runtime_conditions

    ranges = program.range_constraints
    seen = set()
    for condition in runtime_conditions(program):
        symbols = condition.free_symbols
        if condition in seen or len(symbols) != 1:
            continue
        seen.add(condition)
        symbol = next(iter(symbols))
        if symbol not in ranges or not re.fullmatch(r"s\d+", symbol.name):
            continue  # a data-dependent size's: asserted as in any export
        why = _failing(condition, symbol, ranges[symbol])
        if why is not None:
            name = names.get(symbol.name, symbol.name)
            shown = re.sub(rf"\b{symbol.name}\b", name, str(condition))
            return f"deferred to run time, {shown} {why.replace('{}', name)}"
    return None


def _failing(condition: Any, symbol: Any, bounds: Any) -> str | None:
    """Where ``condition`` fails for ``symbol`` in ``bounds`` (a ``ValueRanges``; ``{}``
    stands for the size's name), None when it holds for every value."""
    import sympy

    low = int(bounds.lower)
    high = int(bounds.upper) if isinstance(bounds.upper, sympy.Integer) else None
    last = low + CHECKED if high is None else min(high, low + CHECKED)
    for value in range(low, last + 1):
        if condition.subs(symbol, value) is not sympy.true:
            return f"is false at {{}} = {value}"
    if high is not None and last == high:
        return None
    if _proved(condition, symbol, last + 1):
        return None
    return f"cannot be proved for {{}} > {last} (true up to it)"


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
