"""Putting parameters, buffers, constants and submodules at dotted paths in a module tree.

Intermediate modules that do not exist yet are plain ``torch.nn.Module`` containers (the
``h`` of ``h.0``). The same object may be registered at several paths (tied weights,
component namespaces); a *different* object at a taken path is a bug, reported as such.
"""

from __future__ import annotations

from typing import Any

import torch

from rewrite.backends.fx.source import BUFFER, MODULE, PARAMETER, Attribute

_MISSING = object()


def _child(module: torch.nn.Module, name: str, create: bool) -> torch.nn.Module | None:
    child = module._modules.get(name)
    if child is not None:
        return child
    if not create:
        return None
    if name in module.__dict__ or name in module._parameters or name in module._buffers:
        raise AssertionError(f"{name!r} is an attribute, not a module, in {type(module).__name__}")
    child = torch.nn.Module()
    module.add_module(name, child)
    return child


def lookup(root: torch.nn.Module, path: str) -> Any:
    """The object at ``path`` below ``root``, or ``_MISSING``."""
    *parents, leaf = path.split(".")
    module: torch.nn.Module | None = root
    for part in parents:
        module = _child(module, part, create=False)  # type: ignore[arg-type]
        if module is None:
            return _MISSING
    for table in (module._parameters, module._buffers, module._modules):  # type: ignore[union-attr]
        if leaf in table:
            return table[leaf]
    return module.__dict__.get(leaf, _MISSING)  # type: ignore[union-attr]


def register(root: torch.nn.Module, path: str, attribute: Attribute) -> None:
    """Hold ``attribute.value`` at ``path`` below ``root`` with the attribute's kind."""
    existing = lookup(root, path)
    if existing is attribute.value:
        return
    if existing is not _MISSING:
        raise AssertionError(f"two different values for {path!r} in {type(root).__name__}")
    *parents, leaf = path.split(".")
    module = root
    for part in parents:
        module = _child(module, part, create=True)  # type: ignore[assignment]
    value = attribute.value
    if attribute.kind == PARAMETER and isinstance(value, torch.nn.Parameter):
        module.register_parameter(leaf, value)
    elif attribute.kind in (BUFFER, PARAMETER) and isinstance(value, torch.Tensor):
        module.register_buffer(leaf, value, persistent=attribute.persistent)
    elif attribute.kind == MODULE or isinstance(value, torch.nn.Module):
        module.add_module(leaf, value)
    else:  # tensor constants and script objects: plain attributes, not in state_dict
        setattr(module, leaf, value)


def register_module(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    register(root, path, Attribute(path, module, MODULE))
