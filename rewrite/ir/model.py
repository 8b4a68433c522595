"""The graph IR: frozen records that frontends fill and matchers only read.

* :class:`ModuleCall` -- one call of one module (path, qualified class, call index);
* :class:`Node` -- one operation: inputs as node indices, its stack of calls, its tags;
* :class:`Graph` -- the nodes in topological order and every distinct call.

A graph also has :attr:`Graph.columns` (:mod:`rewrite.ir.columns`): the same facts as flat
integer arrays over distinct stacks, targets and tag sets, which whole-graph passes such as
grouping use instead of the records. Frontends may fill the columns as they read and hand
over ``nodes`` as a :class:`~rewrite.ir.nodes.LazyNodes` (records built on first access);
a graph made of a plain tuple of nodes gets its columns derived on first use.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from attrs import field, frozen

from rewrite.ir.columns import Columns, columns_of


METADATA, NODE_NAMES = "metadata", "node names"
"""Where an ONNX graph's module calls came from (:attr:`Graph.structure`)."""

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
    """Position in topological order; also the node's id in its :class:`Graph`."""
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


@frozen
class Graph:
    """A whole source graph in topological order, with its distinct module calls."""

    nodes: Sequence[Node] = field(repr=False)
    """In topological order; ``nodes[i].index == i``. A tuple, or a
    :class:`~rewrite.ir.nodes.LazyNodes` that builds each record on first access."""
    calls: tuple[ModuleCall, ...] = field(repr=False)
    """Every distinct module call, in order of first appearance."""
    kind: str
    """``fx`` or ``onnx``."""
    root_class: str | None = None
    source: Any = field(default=None, eq=False, repr=False)
    """What the frontend read: an ExportedProgram, a GraphModule or an onnx_ir.Model."""
    _columns: Columns | None = field(default=None, eq=False, repr=False, alias="columns")
    structure: str | None = None
    """Where an ONNX graph's module calls came from: ``metadata`` (torch.onnx's) or ``node
    names`` (their scopes: paths, no classes); None for FX graphs and graphs without calls."""

    @property
    def columns(self) -> Columns:
        """Per-node ids and edges as arrays (see :mod:`rewrite.ir.columns`); built on demand
        when the frontend did not supply them."""
        if self._columns is None:
            object.__setattr__(self, "_columns", columns_of(self.nodes, self.calls))
        return self._columns  # type: ignore[return-value]

    def users(self) -> list[list[int]]:
        """For each node, the indices of the nodes that read it (in graph order)."""
        producer, consumer = self.columns.edges()
        users: list[list[int]] = [[] for _ in range(self.columns.size)]
        for p, c in zip(producer.tolist(), consumer.tolist()):
            users[p].append(c)
        return users
