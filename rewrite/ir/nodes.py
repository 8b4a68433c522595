"""``Graph.nodes`` as a read-only sequence whose :class:`Node` records are made on first use.

A frontend that reads a million-node graph keeps what the nodes are made of in flat lists
(the graph's columns, names, sources) and hands over a :class:`LazyNodes`: indexing,
iterating and ``len`` behave like the tuple of nodes, but each frozen ``Node`` is only built
when someone looks at it, then cached. Grouping reads the columns and never builds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Sequence, overload

if TYPE_CHECKING:
    from rewrite.ir.model import Node


class LazyNodes(Sequence["Node"]):
    """A sequence of nodes built by ``make(i)`` on first access (or all at once)."""

    __slots__ = ("_size", "_make", "_make_all", "_cache", "_all")

    def __init__(self, size: int, make: Callable[[int], "Node"],
                 make_all: Callable[[], Sequence["Node"]] | None = None) -> None:
        self._size = size
        self._make = make
        self._make_all = make_all
        self._cache: list["Node | None"] | None = None
        self._all: tuple["Node", ...] | None = None

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> "Node": ...

    @overload
    def __getitem__(self, index: slice) -> tuple["Node", ...]: ...

    def __getitem__(self, index):
        if self._all is not None:
            return self._all[index]
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._size)))
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError("node index out of range")
        if self._cache is None:
            self._cache = [None] * self._size
        node = self._cache[index]
        if node is None:
            node = self._cache[index] = self._make(index)
        return node

    def materialize(self) -> tuple["Node", ...]:
        """Every node, as a tuple (built once)."""
        if self._all is None:
            cache = self._cache
            if cache is None and self._make_all is not None:
                self._all = tuple(self._make_all())
            else:
                make = self._make
                self._all = tuple(
                    make(i) if cache is None or cache[i] is None else cache[i]
                    for i in range(self._size)
                )
            self._cache = None
        return self._all

    def __iter__(self) -> Iterator["Node"]:
        return iter(self.materialize())

    def __reversed__(self) -> Iterator["Node"]:
        return reversed(self.materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyNodes, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __repr__(self) -> str:
        return f"<{self._size} nodes>"
