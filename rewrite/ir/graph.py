"""A whole graph: its nodes in topological order and its distinct module calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from attrs import field, frozen

from rewrite.ir.columns import Columns
from rewrite.ir.model import ModuleCall, Node
from rewrite.ir.stacks import columns_of

if TYPE_CHECKING:
    from rewrite.files.mapped import MappedFile


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
    mapped: tuple[MappedFile, ...] = field(default=(), eq=False, repr=False)
    """The files the source's weights are views of, as the frontend mapped them (a
    ``.pt2``'s): the ONNX writer copies those weights from them, file to file."""

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
