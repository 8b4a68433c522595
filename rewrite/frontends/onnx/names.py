"""Module calls from ONNX node names, for files without torch.onnx's metadata.

Most ONNX files were not made by torch.onnx's dynamo exporter and carry no
``pkg.torch.onnx.name_scopes``; their producers name each node after its module scope instead:

* torch.onnx's TorchScript exporter (``dynamo=False``): ``/encoder/layer.0/attention/self/
  query/MatMul``, numbered per scope (``MatMul_1``); top-level nodes ``/Add_3``;
* onnxruntime-genai's model builder: ``/model/layers.0/attn/q_proj/MatMul``, with its constants
  in a folder of their own (``/model/constant_nodes/INT64/1``) and outputs named
  ``.../MatMul/output_0``;
* onnxruntime's quantizers and transformer optimizer keep those names, or extend them
  (``/model/layers.0/attn/q_proj/MatMul_Q4``); the nodes they add without one
  (``Attention_0``, ``SkipLayerNorm_AddBias_3``) have no scope.

A node's scope is its name up to the last ``/``: ``/a/b.0/c/Op_3`` gives the calls ``a``,
``a.b.0``, ``a.b.0.c`` (a ``ModuleList`` is not called: ``b.0`` is one step). A node without a
name is read by its first output's name (``/a/b/MatMul_output_0``, ``/a/b/MatMul/output_0``).
No scope (a name not starting with ``/``, a constant folder, a top-level ``Constant``): unknown
(``None``), placed with its neighbours by grouping like any node without metadata. Names give
paths, not classes: every call's class is ``""`` (unknown; see :attr:`ModuleCall.class_name`).
Every call index is 0: :func:`rewrite.frontends.calls.split_runs` numbers repeated calls.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rewrite.ir import ModuleCall, Stack

if TYPE_CHECKING:
    import onnx_ir as ir

CONSTANT_FOLDERS = frozenset(("constant_nodes", "constants"))
"""Scope segments under which a producer keeps shared constants (onnxruntime-genai)."""

_UNSEEN: Stack = ("unseen",)  # type: ignore[assignment]
_OUTPUT_SUFFIX = re.compile(r"(?:/|_)output_\d+$")


def node_scope(node: "ir.Node") -> str | None:
    """The name ``node``'s scope is read from: its own, else its first output's without the
    ``_output_N`` suffix; None when neither starts with ``/``."""
    name = node.name or ""
    if not name and node.outputs:
        name = _OUTPUT_SUFFIX.sub("", node.outputs[0].name or "")
    return name if name.startswith("/") else None


class NameReader:
    """Raw stacks from node names, parsed once per distinct scope."""

    def __init__(self) -> None:
        self._stacks: dict[str, Stack | None] = {}
        self._calls: dict[str, ModuleCall] = {}
        self.found = False
        """Whether any node had a scope below the top level."""

    def read(self, nodes: list["ir.Node"]) -> list[Stack | None]:
        """Per node, its raw stack (None: unknown)."""
        out: list[Stack | None] = []
        stacks = self._stacks
        for node in nodes:
            name = node_scope(node)
            if name is None:
                out.append(None)
                continue
            scope = name[1:name.rfind("/")] if name.count("/") > 1 else ""
            if not scope and node.op_type == "Constant":
                out.append(None)
                continue
            stack = stacks.get(scope, _UNSEEN)
            if stack is _UNSEEN:
                stack = stacks[scope] = self._parse(scope)
            out.append(stack)
        return out

    def _parse(self, scope: str) -> Stack | None:
        if not scope:
            return ()
        parts = scope.split("/")
        if CONSTANT_FOLDERS.intersection(parts) or "" in parts:
            return None
        self.found = True
        paths = [".".join(parts[:i + 1]) for i in range(len(parts))]
        return tuple(self._call(p) for p in paths)

    def _call(self, path: str) -> ModuleCall:
        call = self._calls.get(path)
        if call is None:
            call = self._calls[path] = ModuleCall(path, "")
        return call
