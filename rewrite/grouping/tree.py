"""The result of grouping: a tree of groups over the nodes of one graph."""

from __future__ import annotations

from typing import Iterator

from attrs import field, frozen

from rewrite.compile import Rule, Split
from rewrite.ir import Graph, ModuleCall


@frozen
class Group:
    """A set of nodes that becomes one ONNX function / one FX submodule."""

    id: str
    """Unique in the tree: the keys from the root joined by ``/`` (``h.0/h.0.attn``)."""
    kind: str
    """``root``, ``module`` (one module call) or ``component`` (one split component)."""
    call: ModuleCall | None
    """The module call, for module groups."""
    rule: Rule | Split | None = field(eq=False)
    """The rule that made the group (None for the root)."""
    function_name: str
    """Function / submodule name from the rule's template (``GPT2Block``, ``encode``)."""
    domain: str
    children: tuple["Group", ...] = field(repr=False)
    nodes: tuple[int, ...] = field(repr=False)
    """Indices of the nodes directly in this group (not in a child), in topological order."""
    size: int
    """Number of nodes in the group and all its descendants."""
    tag_value: str | None = None
    """The tag value of a split component."""

    @property
    def key(self) -> str:
        """The last part of :attr:`id`: the call key (``h.0``, ``shared@1``) or tag value."""
        return self.id.rsplit("/", 1)[-1]

    @property
    def origin(self) -> str | None:
        """``file:line`` of the rule that made the group."""
        return self.rule.origin if self.rule is not None else None

    def walk(self) -> Iterator["Group"]:
        """This group and its descendants, parents before children."""
        yield self
        for child in self.children:
            yield from child.walk()

    def all_nodes(self) -> list[int]:
        """Every node in the group or a descendant, in topological order."""
        out = list(self.nodes)
        for child in self.children:
            out.extend(child.all_nodes())
        out.sort()
        return out


@frozen
class GroupTree:
    """Groups of one graph plus what a backend needs to lower them."""

    graph: Graph = field(repr=False)
    root: Group
    owner: tuple[str, ...] = field(repr=False)
    """For each node, the id of the innermost group that holds it (``""`` for the root)."""
    tags: tuple[dict[str, str], ...] = field(repr=False)
    """For each node, its tags after tag rules."""
    warnings: tuple = ()
    """Diagnostics such as rules that matched nothing."""

    def groups(self) -> Iterator[Group]:
        """Every group but the root, parents before children."""
        for child in self.root.children:
            yield from child.walk()

    def find(self, group_id: str) -> Group | None:
        for group in self.root.walk():
            if group.id == group_id:
                return group
        return None
