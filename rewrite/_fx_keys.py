"""Hashable stand-ins for FX node arguments: the one definition both backends use to decide
that two graphs' nodes take the same arguments (the FX backend's code keys, the per-body ONNX
lowering's body keys)."""

from __future__ import annotations

from typing import Any, Hashable

import torch

_SCALARS = (bool, int, str, type(None))
_BY_REPR = (float, complex, torch.dtype, torch.device, torch.layout, torch.memory_format)
"""Values whose ``repr`` is what code generation writes; other objects count by identity."""


def freeze(arg: Any) -> Hashable:
    """``arg`` (an FX node argument, nested) as a hashable key: nodes by name, scalars by
    value, floats and torch enums by ``repr``, any other object by identity."""
    kind = type(arg)
    if kind is torch.fx.Node:
        return ("%", arg.name)
    if kind in _SCALARS:
        return (kind, arg)
    if isinstance(arg, (tuple, list)):
        return (kind, tuple([freeze(a) for a in arg]))
    if isinstance(arg, dict):
        return ("dict", tuple([(k, freeze(v)) for k, v in arg.items()]))
    if isinstance(arg, slice):
        return ("slice", freeze(arg.start), freeze(arg.stop), freeze(arg.step))
    if kind in _BY_REPR:
        return (kind, repr(arg))
    return (kind, id(arg))  # the very object (a global of the generated code)
