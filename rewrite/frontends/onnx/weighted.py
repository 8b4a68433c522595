"""Nodes without metadata that apply a module's weight: with the module that fed them.

A quantizer run after the export (onnxruntime's ``MatMulNBitsQuantizer``) replaces a Linear's
``MatMul`` with a ``MatMulNBits`` that carries no metadata. Placed with its users, as grouping
places such nodes (:mod:`rewrite.grouping.placement`), the ``o_proj`` of an attention or the
``down_proj`` of an MLP would land in the decoder layer that reads its output, one level up. So
here, before grouping, a node without a stack that reads a weight (an initializer that
:func:`rewrite._shared.onnx_ir_nodes.looks_like_weight`) goes

* into the innermost call whose path starts its weights' names, when they name one
  (onnxruntime's optimizer fuses a layer's ``Add`` + ``LayerNormalization`` into an unnamed
  ``SkipLayerNormalization`` reading ``bert.encoder.layer.0.output.LayerNorm.weight``: it goes
  into ``bert.encoder.layer.0.output``, not into the next layer that reads it);
  A module called more than once: the call its users are in (a quantizer's
  ``DequantizeLinear`` stands at the top of the graph, far from the ``Gemm`` that reads it,
  yet it is that call's, not a call of its own);
* else, when its data comes from inside a call *below* the one its users share, into that
  call's child through which the data came (the attention, the MLP). A node fed from its
  users' own level or beside it (``q_proj`` after the layer norm) is left to grouping, which
  places it with its users.

It runs on the numbered stacks (:func:`rewrite.frontends.calls.split_runs`, where a node
without a stack is transparent), so a placed node joins an existing call and never starts one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rewrite._shared.onnx_ir_nodes import looks_like_weight
from rewrite.ir import Stack

if TYPE_CHECKING:
    import onnx_ir as ir


def place_weighted(nodes: Sequence["ir.Node"], stacks: list[Stack | None]) -> None:
    """Give the weighted nodes without a stack the stack described above (in place; numbered
    stacks: one call per run)."""
    index: dict["ir.Node", int] | None = None
    calls: dict[str, Stack] = {}
    for i, node in enumerate(nodes):
        if stacks[i] is not None:
            continue
        weights = [v for v in node.inputs
                   if v is not None and v.is_initializer() and looks_like_weight(v)]
        if not weights:
            continue
        if index is None:
            index = {n: k for k, n in enumerate(nodes)}
            calls = _calls(stacks)
        users = _common([stacks[index[u.node]] for out in node.outputs for u in out.uses()
                         if u.node in index])
        named = _common([_owner(v.name or "", calls) for v in weights])
        if named:
            stacks[i] = _as_users_see(named, users)
            continue
        fed = _common([stacks[index[v.producer()]] for v in node.inputs
                       if v is not None and v.producer() in index])
        if fed is not None and users is not None and len(fed) > len(users) \
                and fed[:len(users)] == users:
            stacks[i] = fed[:len(users) + 1]


def _as_users_see(named: Stack, users: Stack | None) -> Stack:
    """``named`` (the first call of its module) as the call of that module its users are
    in, when they are in one: the users' stack up to that call."""
    path = named[-1].path
    for k, call in enumerate(users or ()):
        if call.path == path:
            return users[:k + 1]  # type: ignore[index]
    return named


def _calls(stacks: list[Stack | None]) -> dict[str, Stack]:
    """Each known call's path -> its stack (the calls around it and itself; of a module
    called more than once, its first call's)."""
    out: dict[str, Stack] = {}
    for stack in dict.fromkeys(s for s in stacks if s):
        for k in range(len(stack)):
            out.setdefault(stack[k].path, stack[:k + 1])
    return out


def _owner(name: str, calls: dict[str, Stack]) -> Stack | None:
    """The stack of the innermost known call whose path starts the weight's name
    (``bert.encoder.layer.0.output.LayerNorm.weight`` -> ``bert.encoder.layer.0.output``)."""
    parts = name.split(".")
    for n in range(len(parts) - 1, 0, -1):
        found = calls.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _common(found: list[Stack | None]) -> Stack | None:
    """The longest common prefix of the known stacks in ``found``; None when none is known."""
    known = [s for s in found if s is not None]
    if not known:
        return None
    first = known[0]
    n = len(first)
    for s in known[1:]:
        n = min(n, len(s))
        while n and s[:n] != first[:n]:
            n -= 1
    return first[:n]
