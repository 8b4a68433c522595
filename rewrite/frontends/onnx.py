"""ONNX frontend: a ``torch.onnx``-exported ``onnx_ir.Model`` -> :class:`Graph`.

IR layout: one ``placeholder`` node per graph input, one ``get_attr`` node per initializer
(both I/O, kept at the top level), one ``onnx`` node per main-graph node in graph order, and
one ``output`` node. A node's inputs include the outer values its subgraphs (``If``/``Loop``
bodies) capture. ``Node.source`` is the ``onnx_ir.Node`` (the ``onnx_ir.Value`` for inputs and
initializers); ``Graph.source`` is the ``onnx_ir.Model``.

Module calls come from the metadata ``torch.onnx`` writes on every node it translated:
``pkg.torch.onnx.name_scopes`` (``['', 'h.0', 'h.0.attn', <fx node name>]``) and
``pkg.torch.onnx.class_hierarchy`` (``[<root class>, <classes>..., <aten target>]``). A node's
target is that aten target when known (so ``op`` rules read the same as on a ``.pt2``), else
``domain::OpType``.

Nodes without metadata. torch.onnx's optimizer makes nodes that carry none (the ``Split`` of
a fused QKV projection, folded constants), and its CSE keeps the metadata of the first of the
nodes it merges, so a later block may read a value "of" block 0. The policy, stage by stage:

* here: ``stack=None`` (also for torch's one-item ``[<fx node name>]`` form);
* grouping (:mod:`rewrite.grouping.placement`): *with their users*, in the innermost module
  call that holds all of them; at the top level when a graph output reads them; dead nodes
  with their producers;
* outlining: small non-weight constants (initializers the export made, ``Constant`` outputs)
  become a ``Constant`` inside every function that reads them
  (:mod:`rewrite.backends.onnx.constants`), and a cheap node one block computes and another
  reads is recomputed in the reader (:mod:`rewrite.backends.onnx.remat`). So functions stay
  valid and identical blocks still share one function.

Known limit: a node without metadata between two nodes of one group that also has a user
outside it (say a residual ``Add`` whose metadata was stripped) goes outside with its users,
so data would leave the group and come back: grouping reports a ``GroupingError`` naming the
group. torch.onnx's own exports do not have such nodes.

Repeated calls. The metadata has no ``@N``: two calls of a shared module look alike. Policy
(:func:`rewrite.frontends.calls.split_runs`): a module path's nodes that form separate
*contiguous runs* (in graph order, under the same parent call) are separate calls ``path``,
``path@1``, ...; nodes without metadata do not break a run. Calls that follow each other with
no node of another module in between (``x = shared(shared(x))``) cannot be told apart and
become one call. A caller that knows better (the ``.pt2`` path, which maps nodes back to the
FX program) passes ``resolve``: its facts are used as they are.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from attrs import field, frozen

from rewrite.errors import InputError
from rewrite.frontends.calls import split_runs
from rewrite.ir import Graph, ModuleCall, Node, Stack

if TYPE_CHECKING:
    import onnx_ir as ir

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"


@frozen
class NodeFacts:
    """What a resolver knows about one ONNX node."""

    stack: Stack | None
    target: str
    tags: Mapping[str, str] = field(factory=dict)


Resolver = Callable[["ir.Node"], "NodeFacts | None"]
"""Facts for a node, or None to fall back to the metadata."""


def onnx_target(node: "ir.Node") -> str:
    """``domain::OpType`` (``ai.onnx`` for the default domain)."""
    return f"{node.domain or 'ai.onnx'}::{node.op_type}"


_PLAIN_LIST = re.compile(r"\[(?:'[^'\\]*'(?:, '[^'\\]*')*)?\]")


def _parse_list(text: str) -> object:
    """``ast.literal_eval`` of a list repr, with a fast path for lists of plain strings
    (``['', 'h.0', 'addmm']``: no quotes or backslashes inside), which is what torch writes."""
    if _PLAIN_LIST.fullmatch(text):
        return text[2:-2].split("', '") if len(text) > 2 else []
    return ast.literal_eval(text)


def read_scopes(node: "ir.Node") -> tuple[list[str], list[str]] | None:
    """``(name_scopes, class_hierarchy)`` from a node's metadata, None when absent/unusable."""
    props = node.metadata_props
    scopes_text = props.get(NAME_SCOPES)
    classes_text = props.get(CLASS_HIERARCHY)
    if not scopes_text or not classes_text:
        return None
    try:
        scopes = _parse_list(scopes_text)
        classes = _parse_list(classes_text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(scopes, list) or not isinstance(classes, list):
        return None
    if len(scopes) != len(classes) or not scopes:
        return None
    return [str(s) for s in scopes], [str(c) for c in classes]


_GRAPH_KINDS: tuple = ()


def _graph_kinds() -> tuple:
    global _GRAPH_KINDS
    if not _GRAPH_KINDS:
        import onnx_ir as ir

        _GRAPH_KINDS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
    return _GRAPH_KINDS


def attribute_values(node: "ir.Node") -> Iterable["ir.Attr"]:
    """``node.attributes.values()``, read from the underlying dict when there is one (the
    mapping view of ``onnx_ir``'s ``UserDict`` is several times slower; most callers are hot)."""
    attrs = node.attributes
    return getattr(attrs, "data", attrs).values()


def holds_graphs(node: "ir.Node") -> bool:
    """Whether an attribute of ``node`` may hold a graph (cheap; most nodes hold none)."""
    attrs = node.attributes
    attrs = getattr(attrs, "data", attrs)
    if not attrs:
        return False
    kinds = _GRAPH_KINDS or _graph_kinds()
    for attr in attrs.values():
        if attr.type in kinds:
            return True
    return False


def subgraph_captures(node: "ir.Node") -> Iterator["ir.Value"]:
    """Outer-scope values read by the nodes of ``node``'s subgraphs (recursively)."""
    import onnx_ir as ir

    for attr in attribute_values(node):
        if attr.type == ir.AttributeType.GRAPH:
            graphs = [attr.as_graph()]
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs = list(attr.as_graphs())
        else:
            continue
        for graph in graphs:
            yield from _graph_captures(graph)


def _graph_captures(graph: "ir.Graph") -> Iterator["ir.Value"]:
    local: set[int] = {id(v) for v in graph.inputs}
    local.update(id(v) for v in graph.initializers.values())
    for inner in graph:
        for value in inner.inputs:
            if value is not None and id(value) not in local:
                yield value
        for captured in subgraph_captures(inner):
            if id(captured) not in local:
                yield captured
        local.update(id(v) for v in inner.outputs)


class _MetadataReader:
    """Raw stacks (every call index 0) from ``name_scopes``/``class_hierarchy``, interned."""

    def __init__(self) -> None:
        self._stacks: dict[tuple, Stack] = {}
        self._by_text: dict[tuple, NodeFacts | None] = {}
        self.root_class: str | None = None

    def facts(self, node: "ir.Node") -> NodeFacts:
        # many nodes share their metadata texts (a block's nodes, repeated blocks): parse once
        props = node.metadata_props
        text = (props.get(NAME_SCOPES), props.get(CLASS_HIERARCHY))
        if text in self._by_text:
            found = self._by_text[text]
        else:
            found = self._by_text[text] = self._parse(node)
        return found if found is not None else NodeFacts(None, onnx_target(node))

    def _parse(self, node: "ir.Node") -> NodeFacts | None:
        scopes = read_scopes(node)
        if scopes is None or scopes[0][0] != "" or len(scopes[0]) < 2:
            # no metadata, or torch's "no nn_module_stack" form [node name]
            return None
        names, classes = scopes
        if self.root_class is None:
            self.root_class = classes[0]
        key = (tuple(names[1:-1]), tuple(classes[1:-1]))
        stack = self._stacks.get(key)
        if stack is None:
            stack = self._stacks[key] = tuple(ModuleCall(p, c) for p, c in zip(*key))
        return NodeFacts(stack, classes[-1])


def _metadata_facts(nodes: list["ir.Node"]) -> tuple[list[NodeFacts], str | None]:
    """Facts from metadata, with repeated calls split into contiguous runs."""
    reader = _MetadataReader()
    raw = [reader.facts(node) for node in nodes]
    stacks = split_runs([f.stack for f in raw])
    return ([f if s is f.stack else NodeFacts(s, f.target) for s, f in zip(stacks, raw)],
            reader.root_class)


def from_onnx_model(
    model: "ir.Model", *, resolve: Resolver | None = None, root_class: str | None = None
) -> Graph:
    """Build the IR of ``model``'s main graph (see the module docstring)."""
    graph = model.graph
    index_of: dict[int, int] = {}
    nodes: list[Node] = []

    def add(node: Node, values) -> None:
        nodes.append(node)
        for value in values:
            index_of[id(value)] = node.index

    for value in graph.inputs:
        add(Node(len(nodes), value.name or "", "placeholder", "input", (), (), is_io=True,
                 source=value), (value,))
    for value in graph.initializers.values():
        if id(value) not in index_of:
            add(Node(len(nodes), value.name or "", "get_attr", "initializer", (), (), is_io=True,
                     source=value), (value,))

    onnx_nodes = list(graph)
    if resolve is not None:
        all_facts = [resolve(n) or NodeFacts(None, onnx_target(n)) for n in onnx_nodes]
    else:
        all_facts, found_root = _metadata_facts(onnx_nodes)
        root_class = root_class or found_root
    calls: dict[ModuleCall, None] = {}
    seen_stacks: set[int] = set()  # most nodes share their stack object: add its calls once
    for onnx_node, facts in zip(onnx_nodes, all_facts):
        inputs = _input_indices(onnx_node, index_of)
        if facts.stack and id(facts.stack) not in seen_stacks:
            seen_stacks.add(id(facts.stack))
            calls.update(dict.fromkeys(facts.stack))
        add(
            Node(len(nodes), onnx_node.name or "", "onnx", facts.target, inputs, facts.stack,
                 dict(facts.tags), source=onnx_node),
            onnx_node.outputs,
        )
    outputs = tuple(dict.fromkeys(index_of[id(v)] for v in graph.outputs if id(v) in index_of))
    nodes.append(Node(len(nodes), "output", "output", "output", outputs, (), is_io=True,
                      source=None))
    return Graph(tuple(nodes), tuple(calls), "onnx", root_class, model)


def _input_indices(node: "ir.Node", index_of: dict[int, int]) -> tuple[int, ...]:
    found: dict[int, None] = {}
    for value in node.inputs:
        if value is not None:
            i = index_of.get(id(value))
            if i is not None:
                found[i] = None
    if holds_graphs(node):
        for value in subgraph_captures(node):
            i = index_of.get(id(value))
            if i is not None:
                found[i] = None
    return tuple(found)


def load_onnx_model(path: str | Path) -> "ir.Model":
    """``onnx_ir.load`` with a clear :class:`InputError` for unreadable files."""
    import onnx_ir as ir

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .onnx file")
    try:
        return ir.load(str(path))
    except Exception as e:  # protobuf and onnx_ir raise many types here; all mean unreadable
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path}: not a readable ONNX model ({reason})") from None


def load_onnx_graph(path: str | Path) -> Graph:
    """The IR of the ONNX model at ``path``."""
    return from_onnx_model(load_onnx_model(path))
