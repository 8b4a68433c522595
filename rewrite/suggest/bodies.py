"""How many structurally distinct bodies the calls of one class have (an estimate).

A call's *body* is its nodes, those of nested calls included, in graph order. Two calls have
the same body when the backend that lowers the model would say so, by its own definition:

* FX-sourced graphs (``.pt2``, ExportedProgram, GraphModule):
  :func:`rewrite._shared.fx_keys.body_key`, the key by which the per-body ONNX lowering
  shares one decomposed body between calls (same ops, constant arguments, data flow, input
  types and shapes). The FX backend's own key, :func:`rewrite.backends.fx.compile.code_key`,
  is not used: it compares generated code, node names included, which only the FX backend's
  renaming makes equal between blocks.
* ONNX-sourced graphs: :meth:`rewrite.backends.onnx.outlining._body_keys.Keyer.body` over the body's
  inputs and outputs (``boundary``), small constants compared by content as the default
  constant policy embeds them (``ConstantPolicy``): the key the outliner gives a body in graph
  order (``repeats``).

Both count a model's ``.pt2`` and its torch.onnx export alike: as many bodies as the ONNX
backend makes functions under the ``embed`` constant policy. An estimate, exact for the usual
repeated blocks: the outliner also recomputes shared nodes per group and keys bodies in a
canonical order (two bodies alike but for the order of their nodes count twice here), the
default ``attribute`` policy merges bodies that differ only in a scalar (an eps, a scale)
into one function, and the optimizer may make two bodies equal or different.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Iterable, Sequence

from rewrite._shared.fx_keys import body_key
from rewrite.ir import Graph, ModuleCall, Node

if TYPE_CHECKING:
    import onnx_ir as ir


def body_keys(graph: Graph, calls: Iterable[ModuleCall]) -> dict[ModuleCall, Hashable]:
    """The body key of each of ``calls``."""
    wanted = set(calls)
    members: dict[ModuleCall, list[Node]] = {c: [] for c in wanted}
    for node in graph.nodes:
        if node.is_io or not node.stack:
            continue
        for call in node.stack:
            if call in wanted:
                members[call].append(node)
    key = _onnx_key(graph.source) if graph.kind == "onnx" else _fx_key
    return {call: key([n.source for n in inside]) for call, inside in members.items()}


def _fx_key(nodes: Sequence) -> Hashable:
    return body_key(nodes)[0]


def _onnx_key(model: ir.Model) -> Callable[[Sequence[ir.Node]], Hashable]:
    """The outliner's body key, for bodies of ``model``'s main graph (the backend is imported
    here, for ONNX-sourced graphs only: it imports torch.onnx and onnxscript)."""
    from rewrite.backends.onnx.options import OnnxOptions
    from rewrite.backends.onnx.outlining import (
        ConstantPolicy,
        Keyer,
        boundary,
        owners,
        weight_names,
    )

    keyer = Keyer()
    policy = ConstantPolicy(OnnxOptions(), keyer, weight_names(model))
    owner = owners(model.graph)

    def key(members: Sequence[ir.Node]) -> Hashable:
        inputs, outputs = boundary(list(members), set(members), owner)
        args, embedded = policy.split(inputs)
        constants = {value: constant.key for value, constant in embedded.items()}
        return keyer.body(("", ""), list(members), args, constants, outputs)

    return key
