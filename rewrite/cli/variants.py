"""Why distinct, in words: one line per variant, the same in the terminal, ``--json`` and the
HTML report. The facts come from the ONNX backend (``backends/onnx/distinct.py``)."""

from __future__ import annotations

from typing import Callable

from rewrite.backends.onnx.distinct import Difference, Side, Variant
from rewrite.backends.onnx.summary import FunctionId, label

_KIND = {
    "shape": "shape of {what}",
    "dtype": "dtype of {what}",
    "op": "op",
    "subtree": "a different group subtree",
    "attribute": "attribute {what}",
    "constant": "constant value",
    "flow": "{what} reads",
    "node": "a node only one of them has",
    "inputs": "number of inputs",
    "outputs": "{what}",
}


def kind_text(difference: Difference) -> str:
    """What the difference is about: ``op``, ``shape of x``, ``attribute epsilon``."""
    return _KIND[difference.kind].format(what=difference.what or "it")


def side_text(side: Side, name: Callable[[FunctionId], str] = label) -> str:
    """One side: its value and where (``Relu at node_relu``, ``calls pkg::MLP at h.0/mlp``)."""
    value = f"calls {name(side.function)}" if side.function else side.value
    return f"{value} at {side.node}" if side.node else value


def reason(variant: Variant) -> str:
    """``Block_1 vs Block: op: Tanh at node_tanh vs Relu at node_relu``."""
    diff = variant.difference
    return (f"{variant.function[1]} vs {variant.first[1]}: {kind_text(diff)}: "
            f"{side_text(diff.other)} vs {side_text(diff.first)}")


__all__ = ["kind_text", "reason", "side_text"]
