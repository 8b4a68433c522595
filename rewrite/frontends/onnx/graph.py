"""ONNX frontend: a ``torch.onnx``-exported ``onnx_ir.Model`` -> :class:`Graph`.

IR layout: one ``placeholder`` node per graph input, one ``get_attr`` node per initializer
(both I/O, kept at the top level), one ``onnx`` node per main-graph node in graph order, and
one ``output`` node. A node's inputs include the outer values its subgraphs (``If``/``Loop``
bodies) capture. ``Node.source`` is the ``onnx_ir.Node`` (the ``onnx_ir.Value`` for inputs and
initializers); ``Graph.source`` is the ``onnx_ir.Model``. The frontend fills the graph's
:class:`~rewrite.ir.columns.Columns` as it reads (metadata parsed once per module, not per
node; the collector paused) and hands over ``Graph.nodes`` as a
:class:`~rewrite.ir.nodes.LazyNodes`: the ``Node`` records are built only when asked for.

Module calls come from the metadata ``torch.onnx`` writes on every node it translated:
``pkg.torch.onnx.name_scopes`` (``['', 'h.0', 'h.0.attn', <fx node name>]``) and
``pkg.torch.onnx.class_hierarchy`` (``[<root class>, <classes>..., <aten target>]``). A node's
target is that aten target when known (so ``op`` rules read the same as on a ``.pt2``), else
``domain::OpType``.

Nodes without metadata. torch.onnx's optimizer makes nodes that carry none (the ``Split`` of
a fused QKV projection, folded constants), and its CSE keeps the metadata of the first of the
nodes it merges, so a later block may read a value "of" block 0. The policy, stage by stage:

* here: ``stack=None`` (also for torch's one-item ``[<fx node name>]`` form), but a node that
  applies a weight to data from a call below its users' goes into that call
  (:mod:`rewrite.frontends.onnx.weighted`: a quantizer's ``MatMulNBits``);
* grouping (:mod:`rewrite.grouping.placement`): *with their users*, in the innermost module
  call that holds all of them; at the top level when a graph output reads them; dead nodes
  with their producers; but a node between a producer and a user of one call (a residual
  ``Add`` whose metadata was stripped, read in its block and by the next) goes into that call;
* outlining: small non-weight constants (initializers the export made, ``Constant`` outputs)
  become a ``Constant`` inside every function that reads them
  (:mod:`rewrite.backends.onnx.outlining._constants`), and a cheap node one block computes and
  another reads is recomputed in the reader (:mod:`rewrite.backends.onnx.outlining._recompute`). So
  functions stay valid and identical blocks still share one function (tested with the metadata of
  all shape plumbing stripped). With all but ``MatMul``/``Gemm``/``LayerNormalization``/``Gather``
  stripped, the functions are still valid and compute the same (tested), but blocks may no
  longer look alike.

Files without that metadata (any node's): module calls from node names' scopes
(:mod:`rewrite.frontends.onnx.names`: paths, no classes); :attr:`Graph.structure` says which.

Repeated calls. The metadata has no ``@N``: two calls of a shared module look alike. Policy
(:func:`rewrite.frontends.calls.split_runs`): a module path's nodes that form separate
*contiguous runs* (in graph order, under the same parent call) are separate calls ``path``,
``path@1``, ...; nodes without metadata do not break a run. Calls that follow each other with
no node of another module in between (``x = shared(shared(x))``) cannot be told apart and
become one call. A caller that knows better (the ``.pt2`` path, which maps nodes back to the
FX program) passes ``resolve``: its facts are used as they are.

Stand-ins. A caller may also pass ``stand_ins``: a main-graph node that stands for several
(a call of a function that was not inlined, see ``backends/onnx/standins.py``) is read as the
rows an :class:`Expansion` gives (their facts and edges), so grouping sees the nodes inlining
would give, without making them; each such row's ``source`` is the standing node
(:func:`expanded_rows`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from attrs import field, frozen

from rewrite._shared.gc import gc_paused
from rewrite._shared.onnx_ir_nodes import graph_kinds, subgraph_captures
from rewrite._private.onnx_ir_attrs import attribute_dict
from rewrite.errors import InputError, first_line, library_call
from rewrite.frontends.calls import split_runs
from rewrite.frontends.onnx.names import NameReader
from rewrite.frontends.onnx.weighted import place_weighted
from rewrite.ir import Graph, ModuleCall, Node, Stack
from rewrite.ir.model import METADATA, NODE_NAMES
from rewrite.ir.columns import Columns, Interner, TagSets
from rewrite.ir.stacks import build_columns
from rewrite.ir.nodes import LazyNodes
from rewrite.ir.stacks import EMPTY, StackTreeBuilder

if TYPE_CHECKING:
    import onnx_ir as ir

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
NAMESPACE = "namespace"
"""torch.onnx's node metadata keys: module paths, classes, and both as one text."""


@frozen
class NodeFacts:
    """What a resolver knows about one ONNX node."""

    stack: Stack | None
    target: str
    tags: Mapping[str, str] = field(factory=dict)


@frozen
class Expansion:
    """The rows one node stands for, in order: each row's facts and what it reads."""

    facts: Sequence[NodeFacts]
    reads: Sequence[tuple[int, ...]]
    """Per row: rows of this expansion it reads (``r >= 0``) and the node's inputs
    (``-1 - p`` for input ``p``)."""
    outputs: Sequence[int]
    """Per output of the node: the row that makes it (-1: none)."""


Resolver = Callable[["ir.Node"], "NodeFacts | None"]
"""Facts for a node, or None to fall back to the metadata."""


def onnx_target(node: "ir.Node") -> str:
    """``domain::OpType`` (``ai.onnx`` for the default domain)."""
    return f"{node.domain or 'ai.onnx'}::{node.op_type}"


_UNSEEN = object()

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
    return _scopes(string_list(props.get(NAME_SCOPES)),
                   string_list(props.get(CLASS_HIERARCHY)))


def string_list(text: str | None) -> list[str] | None:
    """The list of strings ``text`` spells, None when absent or not a list (or not text:
    a corrupt file's metadata that is not UTF-8 reads as bytes)."""
    if not text or type(text) is not str:
        return None
    try:
        parsed = _parse_list(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return [str(s) for s in parsed] if isinstance(parsed, list) else None


def _scopes(names: list[str] | None, classes: list[str] | None
            ) -> tuple[list[str], list[str]] | None:
    """``(names, classes)`` when both are present, of one non-zero length."""
    if names is None or classes is None or len(names) != len(classes) or not names:
        return None
    return names, classes


def _scopes_key(text: str | None) -> str | tuple[str] | None:
    """What a node's stack depends on in its ``name_scopes`` text: the text up to its last
    name, as ``(head,)``, when that name is plain (``['', 'h.0', 'addmm']`` -> ``("['', 'h.0",)``:
    one module's nodes share it); else the whole text."""
    if text is None or type(text) is not str:
        return None  # absent, or bytes (not UTF-8): no metadata
    if '"' in text or "\\" in text or not text.endswith("']"):
        return text
    cut = text.rfind("', '")
    if cut < 0 or "'" in text[cut + 4:-2]:
        return text
    return (text[:cut],)


class _MetadataReader:
    """Raw stacks (every call index 0) and target ids from ``name_scopes``/``class_hierarchy``,
    parsed once per distinct pair of texts without the node's own name (a module's nodes and
    repeated blocks share them)."""

    def __init__(self, targets: Interner) -> None:
        self._targets = targets
        self._stacks: dict[tuple, Stack] = {}
        self._by_text: dict[tuple, tuple[Stack, int] | None] = {}
        self._by_op: dict[tuple[str, str], int] = {}
        self._lists: dict[str, list[str] | None] = {}
        self.root_class: str | None = None

    def read(self, nodes: list["ir.Node"]) -> tuple[list[Stack | None], list[int]]:
        """Per node, its raw stack (None: unknown) and target id."""
        stacks: list[Stack | None] = []
        target_ids: list[int] = []
        by_text = self._by_text
        for node in nodes:
            props = node.metadata_props
            key = (_scopes_key(props.get(NAME_SCOPES)), props.get(CLASS_HIERARCHY))
            found = by_text.get(key, _UNSEEN)
            if found is _UNSEEN:
                found = by_text[key] = self._parse(*key)
            if found is None:
                stacks.append(None)
                target_ids.append(self._op_target(node))
            else:
                stacks.append(found[0])
                target_ids.append(found[1])
        return stacks, target_ids

    def _op_target(self, node: "ir.Node") -> int:
        op = (node.domain, node.op_type)
        found = self._by_op.get(op)
        if found is None:
            found = self._by_op[op] = self._targets.id(onnx_target(node))
        return found

    def _parse(self, scopes_key: str | tuple[str] | None,
               classes_text: str | None) -> tuple[Stack, int] | None:
        if isinstance(scopes_key, tuple):  # the names but the last, which the stack ignores
            names = self._list(scopes_key[0] + "']")
            names = names + [""] if names is not None else None
        else:
            names = self._list(scopes_key)
        scopes = _scopes(names, self._list(classes_text))
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
        return stack, self._targets.id(classes[-1])

    def _list(self, text: str | None) -> list[str] | None:
        """``string_list(text)``, once per text (shared: do not change it)."""
        if text is None:
            return None
        found = self._lists.get(text, _UNSEEN)
        if found is _UNSEEN:
            found = self._lists[text] = string_list(text)
        return found  # type: ignore[return-value]


def from_onnx_model(
    model: "ir.Model", *, resolve: Resolver | None = None, root_class: str | None = None,
    stand_ins: Mapping["ir.Node", Expansion] | None = None,
) -> Graph:
    """Build the IR of ``model``'s main graph (see the module docstring); ``stand_ins`` needs
    ``resolve``."""
    with gc_paused():
        return _read(model, resolve, root_class, stand_ins or {})


def expanded_rows(nodes: Sequence["ir.Node"], stand_ins: Mapping["ir.Node", Expansion]
                  ) -> list["ir.Node"]:
    """Per row of the IR (after the I/O nodes, before the output), its main-graph node."""
    rows: list["ir.Node"] = []
    for node in nodes:
        expansion = stand_ins.get(node)
        if expansion is None:
            rows.append(node)
        else:
            rows.extend([node] * len(expansion.facts))
    return rows


_INPUT, _INITIALIZER, _OUTPUT = 0, 1, 2
"""Target ids of the I/O nodes (the first texts interned)."""


def _read(model: "ir.Model", resolve: Resolver | None, root_class: str | None,
          stand_ins: Mapping["ir.Node", Expansion]) -> Graph:
    graph = model.graph
    inputs = list(graph.inputs)
    io_values = inputs + [v for v in graph.initializers.values() if v not in set(inputs)]
    nodes = list(graph)
    onnx_nodes = expanded_rows(nodes, stand_ins) if stand_ins else nodes
    first, count = len(io_values), len(onnx_nodes)

    targets = Interner(("input", "initializer", "output"))
    tag_sets = TagSets()
    if resolve is None:
        reader = _MetadataReader(targets)
        raw, target_ids = reader.read(onnx_nodes)
        structure = METADATA if reader.root_class is not None else None
        if structure is None:
            names = NameReader()
            named = names.read(onnx_nodes)
            if names.found:
                raw, structure = named, NODE_NAMES
        stacks = split_runs(raw)
        place_weighted(onnx_nodes, stacks)
        tag_ids: list[int] = [0] * count
        root_class = root_class or reader.root_class
    else:
        structure = METADATA
        facts = []
        for n in nodes:
            expansion = stand_ins.get(n) if stand_ins else None
            if expansion is None:
                facts.append(resolve(n) or NodeFacts(None, onnx_target(n)))
            else:
                facts.extend(expansion.facts)
        stacks = [f.stack for f in facts]
        target_ids = [targets.id(f.target) for f in facts]
        tag_ids = [tag_sets.id(f.tags) for f in facts]
    tree = StackTreeBuilder()
    stack_ids = tree.ids(stacks)

    index_of: dict["ir.Value", int] = dict(zip(io_values, range(first)))
    start, flat = _edges(nodes, index_of, first, stand_ins)
    outputs = list(dict.fromkeys(index_of[v] for v in graph.outputs if v in index_of))
    flat.extend(outputs)
    start.append(len(flat))

    io = [True] * first + [False] * count + [True]
    columns = build_columns(
        tree, [EMPTY] * first + stack_ids + [EMPTY], targets.values,
        [_INPUT] * len(inputs) + [_INITIALIZER] * (first - len(inputs)) + target_ids + [_OUTPUT],
        tag_sets.values, [0] * first + tag_ids + [0], io, start, flat,
    )
    layout = _Layout(io_values, len(inputs), onnx_nodes, columns, flat)
    return Graph(LazyNodes(first + count + 1, layout.node), tuple(tree.calls), "onnx",
                 root_class, model, columns=columns, structure=structure)


def _edges(onnx_nodes: list["ir.Node"], index_of: dict["ir.Value", int],
           first: int, stand_ins: Mapping["ir.Node", Expansion]) -> tuple[list[int], list[int]]:
    """CSR input edges of the I/O nodes (none) and the rows; fills ``index_of``."""
    start = [0] * (first + 1)
    flat: list[int] = []
    get = index_of.get
    kinds = graph_kinds()
    i = first - 1
    for node in onnx_nodes:
        i += 1
        expansion = stand_ins.get(node) if stand_ins else None
        if expansion is not None:
            i = _expanded_edges(node, expansion, i, index_of, start, flat) - 1
            continue
        row = dict.fromkeys(map(get, node.inputs))
        for attr in attribute_dict(node).values():  # holds_graphs, inlined
            if attr.type in kinds:
                row.update(dict.fromkeys(map(get, subgraph_captures(node))))
                break
        row.pop(None, None)
        flat.extend(row)
        start.append(len(flat))
        for value in node.outputs:
            index_of[value] = i
    return start, flat


def _expanded_edges(node: "ir.Node", expansion: Expansion, base: int,
                    index_of: dict["ir.Value", int], start: list[int], flat: list[int]) -> int:
    """The edges of ``node``'s rows (from row ``base``); returns the next row."""
    inputs = [index_of.get(v) if v is not None else None for v in node.inputs]
    for reads in expansion.reads:
        row = dict.fromkeys(base + r if r >= 0 else inputs[-1 - r] for r in reads)
        row.pop(None, None)
        flat.extend(row)
        start.append(len(flat))
    for value, r in zip(node.outputs, expansion.outputs):
        if r >= 0:
            index_of[value] = base + r
    return base + len(expansion.reads)


@frozen
class _Layout:
    """What :class:`Node` records are made of (see the module docstring for the layout)."""

    io_values: list["ir.Value"]
    inputs: int
    onnx_nodes: list["ir.Node"]
    columns: Columns
    flat: list[int]

    def node(self, i: int) -> Node:
        """The record of node ``i``."""
        columns = self.columns
        first = len(self.io_values)
        if i < first:
            value = self.io_values[i]
            op, target = ("placeholder", "input") if i < self.inputs else ("get_attr",
                                                                            "initializer")
            return Node(i, value.name or "", op, target, (), (), is_io=True, source=value)
        begin, end = columns.input_start[i:i + 2].tolist()
        inputs = tuple(self.flat[begin:end])
        if i == first + len(self.onnx_nodes):
            return Node(i, "output", "output", "output", inputs, (), is_io=True, source=None)
        onnx_node = self.onnx_nodes[i - first]
        return Node(i, onnx_node.name or "", "onnx", columns.targets[columns.target_id[i]],
                    inputs, columns.stacks[columns.stack_id[i]],
                    columns.tag_sets[columns.tags_id[i]], source=onnx_node)


def load_onnx_model(path: str | Path) -> "ir.Model":
    """``onnx_ir.load`` with a clear :class:`InputError` for unreadable files."""
    import onnx_ir as ir

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .onnx file")
    def unreadable(e: BaseException) -> InputError:
        reason = first_line(e) or type(e).__name__
        return InputError(f"{path}: not a readable ONNX model ({reason})")

    # every node, value and attribute is a new long-lived object: the collector paused
    with library_call("onnx_ir", f"reading {path}", unreadable, parses_input=True), \
            gc_paused():
        return ir.load(str(path))


def load_onnx_graph(path: str | Path) -> Graph:
    """The IR of the ONNX model at ``path``."""
    return from_onnx_model(load_onnx_model(path))
