"""FX frontend: ``torch.fx.GraphModule`` / ``ExportedProgram`` graphs -> :class:`Graph`.

Reads both forms of ``node.meta["nn_module_stack"]``:

* ``{key: (path, cls)}`` from ``torch.export`` and ``symbolic_trace`` (``cls`` a type, or a
  string in a loaded ``.pt2``); a ``@N`` suffix on the key marks the (N+1)-th call;
* the legacy ``{path: cls}``.

The root entry of exported programs (path ``""``) is dropped. A node without a stack, or with
only ``_empty_nn_module_stack_from_metadata_hook``, gets ``stack=None``: grouping places it
with its users. Tags come from ``node.meta["custom"]`` (``torch.fx.traceback.annotate``) and
from ``node.tag``.
"""

from __future__ import annotations

from typing import Any

import torch

from rewrite.ir import Graph, ModuleCall, Node

_EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"
_IO_OPS = ("placeholder", "output")


def class_name(cls: Any) -> str:
    """Qualified name of a class given as a type or a string (``"<class 'a.B'>"`` too)."""
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    text = str(cls)
    if text.startswith("<class '") and text.endswith("'>"):
        return text[len("<class '") : -2]
    return text


def target_name(node: torch.fx.Node) -> str:
    """A stable string for a node's target: ``aten.mm.default``, ``_operator.getitem``."""
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else name


def _call_index(key: str) -> int:
    head, sep, tail = key.rpartition("@")
    if sep and tail.isdigit():
        return int(tail)
    return 0


class _StackReader:
    """Parses ``nn_module_stack`` dicts, memoized on their keys (stacks repeat a lot)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[ModuleCall, ...] | None] = {}
        self._calls: dict[tuple[str, int], ModuleCall] = {}
        self.root_class: str | None = None

    def read(self, raw: Any) -> tuple[ModuleCall, ...] | None:
        if not raw:
            return None
        signature = tuple(raw)
        cached = self._cache.get(signature, self)
        if cached is not self:
            return cached  # type: ignore[return-value]
        stack = self._parse(raw)
        self._cache[signature] = stack
        return stack

    def _parse(self, raw: dict) -> tuple[ModuleCall, ...] | None:
        calls = []
        for key, value in raw.items():
            if key == _EMPTY_STACK_KEY:
                continue
            if isinstance(value, tuple) and len(value) == 2:
                path, cls = value
            else:  # legacy {path: cls}
                path, cls = key.rpartition("@")[0] or key, value
            path = str(path)
            if path == "":
                self.root_class = class_name(cls)
                continue
            index = _call_index(str(key))
            call = self._calls.get((path, index))
            if call is None:
                call = ModuleCall(path, class_name(cls), index)
                self._calls[(path, index)] = call
            calls.append(call)
        if not calls and all(k == _EMPTY_STACK_KEY for k in raw):
            return None
        return tuple(calls)

    @property
    def calls(self) -> dict[tuple[str, int], ModuleCall]:
        return self._calls


def _tags(node: torch.fx.Node) -> dict[str, str]:
    tags: dict[str, str] = {}
    custom = node.meta.get("custom")
    if isinstance(custom, dict):
        for key, value in custom.items():
            if not str(key).startswith("_"):  # torch's own bookkeeping, not user tags
                tags[str(key)] = str(value)
    tag = getattr(node, "tag", None)
    if tag is not None:
        tags.setdefault("tag", str(tag))
    return tags


def from_graph_module(gm: torch.fx.GraphModule, *, source: Any = None) -> Graph:
    """Build the IR of an FX graph (nodes are already in topological order)."""
    reader = _StackReader()
    index_of: dict[torch.fx.Node, int] = {}
    nodes: list[Node] = []
    order: list[ModuleCall] = []
    seen: set[ModuleCall] = set()
    for i, fx_node in enumerate(gm.graph.nodes):
        index_of[fx_node] = i
        is_io = fx_node.op in _IO_OPS
        stack = () if is_io else reader.read(fx_node.meta.get("nn_module_stack"))
        if stack:
            for call in stack:
                if call not in seen:
                    seen.add(call)
                    order.append(call)
        inputs = tuple(dict.fromkeys(index_of[n] for n in fx_node.all_input_nodes))
        nodes.append(
            Node(
                index=i,
                name=fx_node.name,
                op=fx_node.op,
                target=target_name(fx_node),
                inputs=inputs,
                stack=stack,
                tags=_tags(fx_node),
                is_io=is_io,
                source=fx_node,
            )
        )
    root_class = reader.root_class
    if root_class is None and type(gm).__name__ != "GraphModule":
        root_class = class_name(type(gm))
    return Graph(tuple(nodes), tuple(order), "fx", root_class, source if source is not None else gm)


def from_exported_program(program: torch.export.ExportedProgram) -> Graph:
    """Build the IR of an exported program's graph (parameters are placeholders)."""
    return from_graph_module(program.graph_module, source=program)
