"""Compile the generated code once per distinct submodule body.

``GraphModule.__init__`` generates and compiles Python code for every module; for a model
with hundreds of submodule calls that dominates the run time. Lowered modules are built as
lazy GraphModules (no code yet). :func:`compile_tree` then walks the tree parents first and
compiles each distinct body once: a module whose graph generates the same code as one
already compiled (same node names, ops, targets, arguments and code comments, see
:func:`code_key`) reuses that module's ``forward`` function and code text. Because local
names make the blocks of a model identical (:mod:`names`), a 48-block GPT-2 compiles ~20
bodies instead of ~600.

Each module keeps its own class (as every GraphModule does), so ``recompile()`` after editing
one graph affects that module only.
"""

from __future__ import annotations

import os
from typing import Hashable, Iterable

import torch

from rewrite._shared.fx_keys import freeze, target_key
from rewrite._private.torch_programs import real_recompile
from rewrite.backends.fx.module import LoweredModule

_CODE_FIELDS = ("_code", "_lineno_map", "_prologue_start")


def code_key(graph: torch.fx.Graph) -> Hashable | None:
    """Everything the generated (non-verbose) code of ``graph`` depends on, or None.

    Not :func:`rewrite._shared.fx_keys.body_key`: two modules share compiled code only when their
    code *text* is the same, so node names, stack traces and code comments count here,
    where a structural body key ignores them (arguments are compared alike: ``freeze``)."""
    if os.environ.get("FX_GRAPH_SHOW_META", "0") == "1":
        return None
    parts = []
    for node in graph.nodes:
        meta = node.meta
        custom = meta.get("custom")
        parts.append((
            node.op, target_key(node), node.name, freeze(node.args), freeze(node.kwargs),
            node.type, meta.get("stack_trace"), repr(custom) if custom else None,
            repr(meta.get("recompute")), repr(meta.get("ac_graph_id")),
        ))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _adopt(module: LoweredModule, donor: LoweredModule) -> None:
    """Give ``module`` the compiled ``forward`` and code of ``donor`` (same generated code)."""
    type(module).forward = type(donor).forward  # type: ignore[method-assign]
    for name in _CODE_FIELDS:
        if hasattr(donor, name):
            setattr(module, name, getattr(donor, name))


def compile_tree(root: LoweredModule, keys: dict[int, Hashable | None]) -> int:
    """Compile ``root`` and every lowered module below it; returns how many were compiled.

    ``keys`` maps ``id(module)`` to its :func:`code_key`. Parents come before children, since
    compiling a GraphModule resets the code of its direct GraphModule children.
    """
    compiled: dict[Hashable, LoweredModule] = {}
    count = 0
    for module in _preorder(root):
        key = keys.get(id(module))
        donor = compiled.get(key) if key is not None else None
        if donor is not None:
            _adopt(module, donor)
            continue
        real_recompile(module)
        count += 1
        if key is not None:
            compiled[key] = module
    return count


def _preorder(root: torch.nn.Module) -> Iterable[LoweredModule]:
    for module in root.modules():  # pre-order, each module once
        if isinstance(module, LoweredModule):
            yield module
