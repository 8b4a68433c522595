"""Which values from outside a function become ``Constant`` nodes inside it.

Under the ``embed`` policy (see :class:`OnnxOptions`), a value is embedded when it is

* an initializer that is not a weight, with at most ``constant_limit`` elements, or
* the output of a ``Constant`` node (unoptimized exports) no larger than that.

Weights are the program's parameters, buffers and lifted tensor constants: initializers torch
marks (``pkg.torch.export.graph_signature.InputSpec.kind``), those named as input targets in
the graph's ``pkg.torch.export.ExportedProgram.graph_signature``, and initializers the optimizer
folded from one of those (``pkg.onnxscript.optimizer.folded_from``, e.g. a transposed weight).
Everything else was made by the export or its optimizer (shapes, scales, masks); an initializer
of no known origin (another producer's file, a quantizer's new weights) is a weight when it looks
like one (``_shared.onnx_ir_nodes.looks_like_weight``: not a scalar, not an index or mask type,
or int32 data only ``DequantizeLinear`` reads: a QDQ quantizer's bias).

Each function that reads such a value gets its own ``Constant`` node, so functions never
depend on nodes hoisted or shared across blocks by the optimizer; the value is part of the
function's structural key.

Under the ``input`` policy, the small ``Constant`` nodes of the (unoptimized) export that sit
inside groups are moved to the top level first (:func:`hoist_constants`), so they reach the
functions as inputs like the initializers of an optimized export.
"""

from __future__ import annotations

import ast
import re
from typing import Hashable, Sequence

import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx.outlining._membership import Membership
from rewrite._shared.onnx_ir_nodes import looks_like_weight
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining._body_keys import Key, Keyer

WEIGHT_MARKS = (
    "pkg.torch.export.graph_signature.InputSpec.kind",
    "pkg.torch.onnx.original_node_name",
)
SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_TARGET = re.compile(r"target='([^']*)'")
_LIST_ATTRS = (ir.AttributeType.FLOATS, ir.AttributeType.INTS, ir.AttributeType.STRINGS)


def weight_names(model: ir.Model) -> set[str]:
    """Names of the torch program's parameters, buffers and lifted constants."""
    signature = model.graph.metadata_props.get(SIGNATURE_KEY, "")
    # bytes when the file's text is not UTF-8 (a corrupt file): no names from it here; writing
    # the model refuses it (``frontends.onnx.check.unwritable_input``)
    names = set(_TARGET.findall(signature)) if isinstance(signature, str) else set()
    for name, value in model.graph.initializers.items():
        if any(mark in value.metadata_props for mark in WEIGHT_MARKS):
            names.add(name)
    return names


def is_weight(value: ir.Value, weights: set[str]) -> bool:
    """A weight, an initializer the optimizer folded from one, or one of no known origin that
    looks like a weight (a quantizer's: ``MatMulNBits``' packed weights and scales)."""
    if value.name in weights or any(mark in value.metadata_props for mark in WEIGHT_MARKS):
        return True
    folded = value.metadata_props.get(FOLDED_FROM)
    if not folded:  # made after the export (a quantizer's weights and scales)?
        return looks_like_weight(value)
    try:
        sources = ast.literal_eval(folded)
    except (ValueError, SyntaxError):
        return True  # unreadable provenance: keep it an input, which is always correct
    return any(str(name) in weights for name in sources)


@frozen
class Embedded:
    """A constant to recreate inside a function."""

    key: Hashable
    attribute: ir.Attr
    name: str | None
    value: ir.Value

    def make_node(self) -> ir.Node:
        """A fresh ``Constant`` node producing the value (same name, type and shape)."""
        attr = ir.Attr(self.attribute.name, self.attribute.type, self.attribute.value)
        out = ir.Value(name=self.name, type=self.value.type, shape=self.value.shape)
        return ir.Node("", "Constant", (), (attr,), outputs=(out,), name=f"{self.name}_constant")


class ConstantPolicy:
    """Decides, once per value, whether it is embedded."""

    def __init__(self, options: OnnxOptions, keyer: Keyer, weights: set[str]) -> None:
        self._weights = weights
        self._embed = options.constants != "input"
        self._limit = options.constant_limit
        self._keyer = keyer
        self._cache: dict[ir.Value, Embedded | None] = {}

    def split(self, inputs: Sequence[ir.Value]
              ) -> tuple[list[ir.Value], dict[ir.Value, Embedded]]:
        """A body's ``inputs`` -> (its function's arguments, the constants embedded in it)."""
        args: list[ir.Value] = []
        embedded: dict[ir.Value, Embedded] = {}
        for value in inputs:
            found = self.embedded(value)
            if found is None:
                args.append(value)
            else:
                embedded[value] = found
        return args, embedded

    def key_of(self, value: ir.Value) -> Key | None:
        """The key of the constant embedded for ``value`` (None: it is an argument)."""
        found = self.embedded(value)
        return found.key if found is not None else None

    def embedded(self, value: ir.Value) -> Embedded | None:
        if not self._embed:
            return None
        if value in self._cache:
            return self._cache[value]
        found = self._find(value)
        self._cache[value] = found
        return found

    def _find(self, value: ir.Value) -> Embedded | None:
        producer = value.producer()
        if producer is None:
            tensor = value.const_value
            if (not value.is_initializer() or value.is_graph_input() or tensor is None
                    or is_weight(value, self._weights) or tensor.size > self._limit):
                return None
            attr = ir.Attr("value", ir.AttributeType.TENSOR, tensor)
            return Embedded(("const", self._keyer.tensor(tensor)), attr, value.name, value)
        if producer.op_type != "Constant" or producer.domain != "" or len(producer.attributes) != 1:
            return None
        (attr,) = producer.attributes.values()
        if attr.is_ref():
            return None
        if attr.type == ir.AttributeType.TENSOR and attr.value.size > self._limit:
            return None
        if attr.type in _LIST_ATTRS and len(attr.value) > self._limit:
            return None
        if attr.type == ir.AttributeType.SPARSE_TENSOR:
            return None
        key = ("const", attr.name, self._keyer.attribute(attr, {}, 0))
        return Embedded(key, attr, value.name, value)


def hoist_constants(members: Membership, options: OnnxOptions, keyer: Keyer) -> int:
    """Under the ``input`` policy, move the small ``Constant`` nodes of groups to the top level
    (their values become function inputs); returns how many moved."""
    if options.constants != "input":
        return 0
    small = ConstantPolicy(OnnxOptions(constants="embed", constant_limit=options.constant_limit),
                           keyer, set())
    moved = [node for group, nodes in members.nodes.items() if group
             for node in nodes if node.op_type == "Constant" and node.domain == ""
             and small.embedded(node.outputs[0]) is not None]
    for node in moved:
        position = members.position[node]
        members.discard(node)
        members.add(node, 0, position)
    return len(moved)
