"""Dynamic sizes a model's code bounds: a position table as long as the model's context, an
attention that changes kind beyond some length.

torch.export cannot prove such a model's code for every length of a dynamic size and says
so in a "Constraints violated" error, with the bounds that would make it hold (its
"Suggested fixes"). Where each fix only bounds a size from above, the model is exported
again within those bounds (:class:`Bounded` carries them) and the user is told: a longer
input takes another path in the model's own code, which the exported graph does not have.
The written model says so too, in its metadata (:data:`KEY`, :func:`record`), where a runtime
configuration can read it (``genai_config.json``'s context length).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from rewrite.errors import InputError

if TYPE_CHECKING:
    import onnx_ir as ir

KEY = "rewrite.bounded_sizes"
"""The ONNX metadata key of the sizes a model was exported for: ``name<=N`` joined by ``;``."""


class Bounded(InputError):
    """torch.export's verdict that the model holds for dynamic sizes of at most
    ``limits`` (a size's name: its largest value) only; ``why``: whose verdict (rewrite's
    where a condition deferred to run time holds up to some length only)."""

    def __init__(self, model: str, limits: Mapping[str, int], why: str = "torch.export's bounds"):
        self.limits = dict(limits)
        most = ", ".join(f"{name} <= {value}" for name, value in self.limits.items())
        self.says = (f"{model}: its code holds for {most} only ({why}; longer inputs take "
                     "another path in the model): exported for those lengths")
        super().__init__(self.says)


def bounds(message: str) -> dict[str, int]:
    """The bounds torch.export suggests in a "Constraints violated" ``message`` when each
    fix only bounds a dynamic size from above (its lower bound at most 2: a one-token decode
    step and a prompt stay possible): each size's name and its largest value; empty for any
    other message or fix (a size made constant, sizes tied to each other)."""
    _, found, fixes = message.partition("Suggested fixes:")
    lines = [line.strip() for line in fixes.strip().splitlines()] if found else []
    lines = lines[:next((i for i, line in enumerate(lines)
                         if not re.match(r"\w+ = ", line)), len(lines))]
    limits = {}
    for line in lines:
        fix = re.fullmatch(r"(\w+) = Dim\('\w+'(?:, min=(\d+))?, max=(\d+)\)", line)
        if fix is None or int(fix.group(2) or 0) > 2:
            return {}
        limits[fix.group(1)] = int(fix.group(3))
    return limits


def within(shapes: Any, limits: Mapping[str, int]) -> Any:
    """``shapes`` (dynamic shapes: nested tuples, lists and dicts of ``Dim``) with each ``Dim``
    named in ``limits`` bounded by it."""
    import torch

    if isinstance(shapes, (tuple, list)):
        return type(shapes)(within(shape, limits) for shape in shapes)
    if isinstance(shapes, dict):
        return {key: within(shape, limits) for key, shape in shapes.items()}
    name = getattr(shapes, "__name__", None)
    if name in limits and hasattr(shapes, "min"):
        return torch.export.Dim(name, min=shapes.min, max=limits[name])
    return shapes


def record(model: "ir.Model", limits: Mapping[str, int]) -> None:
    """Say in ``model``'s metadata the largest value of each size in ``limits`` (none: no
    entry)."""
    if limits:
        model.metadata_props[KEY] = ";".join(f"{n}<={v}" for n, v in limits.items())


def recorded(model: "ir.Model") -> dict[str, int]:
    """The bounds :func:`record` put in ``model``'s metadata."""
    text = model.metadata_props.get(KEY, "")
    pairs = (part.split("<=") for part in text.split(";") if "<=" in part)
    return {name: int(value) for name, value in pairs}
