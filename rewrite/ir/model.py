"""The graph IR: frozen records that frontends fill and matchers only read.

* :class:`ModuleCall` -- one call of one module (path, qualified class, call index);
* :class:`Node` -- one operation: inputs as node indices, its stack of calls, its tags;
* :class:`~rewrite.ir.graph.Graph` -- the nodes in topological order and every distinct call.

A graph also has :attr:`~rewrite.ir.graph.Graph.columns` (:mod:`rewrite.ir.columns`): the
same facts as flat integer arrays over distinct stacks, targets and tag sets, which
whole-graph passes such as grouping use instead of the records. Frontends may fill the
columns as they read and hand over ``nodes`` as a :class:`~rewrite.ir.nodes.LazyNodes`
(records built on first access);
a graph made of a plain tuple of nodes gets its columns derived on first use.
"""

from __future__ import annotations

from typing import Any, Mapping

from attrs import field, frozen



METADATA, NODE_NAMES = "metadata", "node names"
"""Where an ONNX graph's module calls came from (:attr:`~rewrite.ir.graph.Graph.structure`)."""

UNKNOWN_PACKAGE = "local"
"""The package of a call whose class is unknown (default domain ``pkg.local``)."""


@frozen(cache_hash=True)
class ModuleCall:
    """One call of one ``nn.Module``: a shared module called twice is two calls."""

    path: str
    """Module path in the root module, ``h.0.attn``."""
    cls: str
    """Qualified class name, ``transformers.models.gpt2.modeling_gpt2.GPT2Attention``."""
    index: int = 0
    """0 for the first call of the module at ``path``, N for its (N+1)-th call (``@N``)."""

    @property
    def key(self) -> str:
        """``path`` for the first call, ``path@N`` for later ones; unique in a graph."""
        return self.path if self.index == 0 else f"{self.path}@{self.index}"

    @staticmethod
    def split_key(key: str) -> tuple[str, str | None]:
        """``nn_module_stack`` key -> ``(head, N)`` for ``head@N`` (digits), else ``(key,
        None)``: the inverse of :attr:`key`."""
        head, sep, tail = key.rpartition("@")
        return (head, tail) if sep and tail.isdigit() else (key, None)

    @property
    def class_name(self) -> str:
        """The class name without its module, ``GPT2Attention``; for a call whose class is
        unknown (``cls`` empty: read from ONNX node names), the module's name in its parent
        without its index (``layers`` for ``model.layers.0``), so that names made from it do
        not depend on the layer."""
        if not self.cls:
            parts = self.path.split(".")
            while len(parts) > 1 and parts[-1].isdigit():
                parts.pop()
            return parts[-1]
        return self.cls.rsplit(".", 1)[-1]

    @property
    def siblings(self) -> str:
        """The path glob of this module and its repeated siblings: every index a ``*``
        (``model.layers.*.attn`` for ``model.layers.0.attn``)."""
        return ".".join("*" if p.isdigit() else p for p in self.path.split("."))

    @property
    def package(self) -> str:
        """The top-level package the class comes from, ``transformers``; ``local`` when the
        class is unknown."""
        if not self.cls:
            return UNKNOWN_PACKAGE
        return self.cls.split(".", 1)[0] if "." in self.cls else self.cls


Stack = tuple[ModuleCall, ...]


@frozen
class Node:
    """One operation of the source graph."""

    index: int
    """Position in topological order; also the node's id in its :class:`~rewrite.ir.graph.Graph`."""
    name: str
    op: str
    """``placeholder``, ``call_function``, ``get_attr``, ``output``...
    or ``onnx`` for ONNX nodes."""
    target: str
    """``aten.mm.default``, ``_operator.getitem``, or the ONNX ``domain::OpType``."""
    inputs: tuple[int, ...]
    """Indices of the nodes whose values this node reads (each once, in order)."""
    stack: Stack | None
    """Module calls around the node, outermost first, root excluded; None when unknown."""
    tags: Mapping[str, str] = field(factory=dict)
    is_io: bool = False
    """Graph inputs and outputs always stay at the top level."""
    source: Any = field(default=None, eq=False, repr=False)
    """The frontend's node (``torch.fx.Node`` or ``onnx_ir.Node``)."""
