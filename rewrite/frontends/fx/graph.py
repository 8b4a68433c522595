"""FX frontend: ``torch.fx`` graphs (``GraphModule``, ``ExportedProgram``) -> :class:`Graph`.

Module stacks come from ``node.meta["nn_module_stack"]``, in either form:

* ``{key: (path, cls)}`` from ``torch.export`` and ``torch.fx.symbolic_trace``; ``cls`` is a
  type, or a string in a loaded ``.pt2``. A key ending in ``@N`` marks the (N+1)-th call of
  the module at ``path``: a shared module called twice gives two :class:`rewrite.ir.ModuleCall`\\ s;
* ``{path: cls}`` from older tracers. It has no call indices, so calls are recovered from the
  order of the nodes (:func:`rewrite.frontends.calls.split_runs`): a path whose nodes form
  separate runs is one call per run.

The root entry of exported programs (path ``""``) is dropped; its class is the graph's
``root_class``. Which nodes have no stack, and where they go:

* graph inputs and outputs (``placeholder``, ``output``) are always at the top level;
* in exported programs every traced node has a stack (the root entry at least), so a node
  without one, or with only ``_empty_nn_module_stack_from_metadata_hook``, was made by a
  pass: its stack is unknown (``None``) and grouping places it with its users;
* a higher-order op region (a ``torch.no_grad()`` block...) that a strict export recorded at
  the root takes the stack its body's nodes agree on (:mod:`rewrite.frontends.fx.regions`);
* ``symbolic_trace`` records no root entry: its nodes without a stack were traced in the root
  module's own ``forward``, so ``call_function``/``call_method``/``call_module`` nodes get
  the empty stack (top level). ``get_attr`` nodes stay unknown and go with their users.

Tags come from ``node.meta["custom"]`` (``torch.fx.traceback.annotate``; keys starting with
``_`` are torch's own and skipped) and from ``node.tag`` (as tag ``tag``).

The frontend also fills the graph's :class:`~rewrite.ir.columns.Columns` as it reads, with
one dictionary lookup per node for its stack, target and tags (each distinct value is parsed
once: stacks by :mod:`rewrite.frontends.fx.nn_module_stack` into the one stack-tree builder,
:class:`~rewrite.ir.stacks.StackTreeBuilder`) and the garbage collector paused.
"""

from __future__ import annotations

from itertools import chain, islice
from operator import ne
from typing import Any

import numpy as np
import torch

from rewrite._shared.gc import gc_paused
from rewrite._private.torch_programs import is_op_overload
from rewrite.errors import InputError
from rewrite.frontends.calls import split_runs
from rewrite.frontends.fx.nn_module_stack import EMPTY_STACK_KEY, STACK, NnModuleStacks, class_name
from rewrite.frontends.fx.regions import region_stacks
from rewrite.ir import Graph, Node
from rewrite.ir.columns import EMPTY_TAGS, TagSets
from rewrite.ir.stacks import build_columns
from rewrite.ir.nodes import LazyNodes
from rewrite.ir.stacks import EMPTY, UNKNOWN, StackTreeBuilder

_IO_OPS = frozenset(("placeholder", "output"))
_ROOT_LEVEL_OPS = frozenset(("call_function", "call_method", "call_module"))


def _target_text(target: Any) -> str:
    if isinstance(target, str):
        return target
    if is_op_overload(target):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else name


def from_fx_graph(
    graph: torch.fx.Graph,
    *,
    source: Any = None,
    root_class: str | None = None,
    split_calls: bool | None = None,
) -> Graph:
    """Build the IR of an FX graph (its nodes are already in topological order).

    ``split_calls``: recover calls from runs of nodes (see the module docstring); default:
    only when the stacks have the ``{path: cls}`` form, which has no call indices.
    """
    with gc_paused():
        return _read(graph, source, root_class, split_calls)


def _stack_ids(metas: list[dict], is_io: list[bool], io: np.ndarray
               ) -> tuple[NnModuleStacks, np.ndarray]:
    """Each node's stack id (graph inputs and outputs: the top level), and the reader that
    numbered the stacks."""
    size = len(metas)
    reader = NnModuleStacks()
    # graph inputs and outputs are at the top level whatever their metadata says: not read
    keys = [tuple(r) if not x and (r := m.get(STACK)) else None
            for m, x in zip(metas, is_io)]
    # neighbours mostly share their stack: look keys up once per run of equal ones
    change = np.fromiter(map(ne, islice(keys, 1, None), keys), dtype=bool,
                         count=max(size - 1, 0))
    starts = _run_starts(change, size)
    run_keys = list(map(keys.__getitem__, starts.tolist()))
    del keys
    distinct = dict(zip(run_keys, map(metas.__getitem__, starts.tolist())))  # first seen order
    distinct.pop(None, None)
    ids = reader.read_all(distinct)
    ids[None] = UNKNOWN  # type: ignore[index]
    stack_id = _repeat_runs(np.fromiter(map(ids.__getitem__, run_keys), dtype=np.int32,
                                        count=len(run_keys)), starts, size)
    stack_id[io] = EMPTY
    return reader, stack_id


def _read(graph: torch.fx.Graph, source: Any, root_class: str | None,
          split_calls: bool | None) -> Graph:
    # One column at a time: comprehensions and C-level map calls per node, Python work only
    # per distinct stack, target, tag set (per run of equal ones) and graph input.
    fx_nodes = list(graph.nodes)
    size = len(fx_nodes)
    ops = [n.op for n in fx_nodes]
    metas = [n.meta for n in fx_nodes]
    stacks = region_stacks(graph)  # regions a strict export put at the root
    if stacks:
        position = {node: i for i, node in enumerate(fx_nodes)}
        for node, stack in stacks.items():
            metas[position[node]] = {**node.meta, STACK: stack}
    is_io = list(map(_IO_OPS.__contains__, ops))
    io = np.fromiter(is_io, dtype=bool, count=size)
    reader, stack_id = _stack_ids(metas, is_io, io)

    targets, target_id = _target_ids(fx_nodes)
    tag_sets = TagSets()
    tags_id = _tag_ids(fx_nodes, metas, tag_sets)
    start, flat = _edges(fx_nodes)
    del metas

    tree = reader.tree
    if not reader.saw_root and tree.calls:
        # symbolic_trace: a node traced in the root module's forward carries no stack
        root_ops = _ROOT_LEVEL_OPS
        at_root = np.fromiter(map(root_ops.__contains__, ops), dtype=bool, count=size)
        stack_id = np.where(at_root & (stack_id == UNKNOWN), EMPTY, stack_id).astype(np.int32)
    if reader.legacy if split_calls is None else split_calls:
        split = split_runs([None if x else tree.stacks[k]
                            for x, k in zip(is_io, stack_id.tolist())])
        tree = StackTreeBuilder()
        stack_id = np.array(tree.ids(split), dtype=np.int32)
        stack_id[io] = EMPTY
    calls = tuple(tree.calls)

    columns = build_columns(tree, stack_id, targets, target_id, tag_sets.values, tags_id, io,
                            start, flat)
    nodes = _lazy_nodes(fx_nodes, ops, targets, target_id, tree.stacks, stack_id,
                        tag_sets.values, tags_id, is_io, flat, start)
    return Graph(nodes, calls, "fx", root_class or reader.root_class, source,
                 columns=columns)


def _target_ids(fx_nodes: list[torch.fx.Node]) -> tuple[list[str], np.ndarray]:
    """The distinct target texts (in order of first appearance) and each node's index in
    them. Each target object is read once, known by its identity (op overloads hash in
    Python); placeholders' targets are their names, already text."""
    raw = [n.target for n in fx_nodes]
    idents = list(map(id, raw))
    objects = dict(zip(idents, raw))
    texts = [t if type(t) is str else _target_text(t) for t in objects.values()]
    numbers: dict[str, int] = {}
    object_text = dict(zip(objects, [numbers.setdefault(t, len(numbers)) for t in texts]))
    target_id = np.fromiter(map(object_text.__getitem__, idents), dtype=np.int32,
                            count=len(raw))
    return list(numbers), target_id


def _tag_ids(fx_nodes: list[torch.fx.Node], metas: list[dict], tag_sets: TagSets
             ) -> np.ndarray:
    """Per node, the id of its tag set (``meta["custom"]`` and ``node.tag``).

    Neighbours usually carry equal tags: the tags are read once per run of equal ones."""
    size = len(fx_nodes)
    customs = [m.get("custom") for m in metas]
    tags = [getattr(n, "tag", None) for n in fx_nodes]
    no_tag = tags.count(None) == size
    if no_tag and not any(customs):
        return np.zeros(size, dtype=np.int32)
    try:
        change = np.fromiter(map(ne, customs[1:], customs), dtype=bool, count=size - 1)
        if not no_tag:
            change |= np.fromiter(map(ne, tags[1:], tags), dtype=bool, count=size - 1)
    except Exception:  # values that do not compare (tensors...): one node at a time
        return np.array([tag_sets.id(_tags(c, t)) for c, t in zip(customs, tags)],
                        dtype=np.int32).reshape(size)
    starts = _run_starts(change, size)
    known: dict[Any, int] = {}
    run_ids = []
    for i in starts.tolist():
        custom, tag = customs[i], tags[i]
        try:
            key = (tuple(custom.items()) if type(custom) is dict else None, tag)
            found = known.get(key)
            if found is None:
                found = known[key] = tag_sets.id(_tags(custom, tag))
        except TypeError:  # unhashable values
            found = tag_sets.id(_tags(custom, tag))
        run_ids.append(found)
    return _repeat_runs(np.array(run_ids, dtype=np.int32), starts, size)


def _run_starts(change: np.ndarray, size: int) -> np.ndarray:
    """The first index of each run of ``size`` items; ``change[i]``: item ``i + 1`` differs
    from item ``i``."""
    if not size:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(change)
    starts += 1
    return np.concatenate((np.zeros(1, dtype=starts.dtype), starts))


def _repeat_runs(run_values: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """Per item, the value of its run."""
    return np.repeat(run_values, np.diff(starts, append=size))


def _tags(custom: Any, tag: Any) -> dict[str, str]:
    tags: dict[str, str] = {}
    if isinstance(custom, dict):
        for name, value in custom.items():
            if not str(name).startswith("_"):  # torch's own bookkeeping, not user tags
                tags[str(name)] = str(value)
    if tag is not None:
        tags.setdefault("tag", str(tag))
    return tags


def _edges(fx_nodes: list[torch.fx.Node]) -> tuple[np.ndarray, np.ndarray]:
    """The input edges as CSR arrays: node ``i`` reads ``flat[start[i]:start[i + 1]]``.

    Inputs are found by identity in a sorted array of the nodes' ids (no dict of the
    nodes: a million-entry hash table is slower to build and to probe than a sort)."""
    size = len(fx_nodes)
    if size and not hasattr(fx_nodes[0], "_input_nodes"):  # pragma: no cover - other torch
        inputs: list = [n.all_input_nodes for n in fx_nodes]
    else:
        inputs = [n._input_nodes for n in fx_nodes]
    start = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, inputs), dtype=np.int64, count=size), out=start[1:])
    total = int(start[-1])
    node_ids = np.fromiter(map(id, fx_nodes), dtype=np.uint64, count=size)
    order = np.argsort(node_ids, kind="stable")  # nodes are mostly allocated in order
    sorted_ids = node_ids[order]
    wanted = np.fromiter(map(id, chain.from_iterable(inputs)), dtype=np.uint64, count=total)
    at = np.searchsorted(sorted_ids, wanted)
    if total and (int(at.max()) >= size or not np.array_equal(sorted_ids[at], wanted)):
        members = set(fx_nodes)
        bad = next(x for ins in inputs for x in ins if x not in members)
        raise InputError(f"the graph is malformed: node {bad} is an input of one of its "
                         "nodes but not a node of the graph")
    return start, order[at]


def _lazy_nodes(fx_nodes, ops, target_text, target_id, table, stack_id, tag_values, tags_id,
                is_io, flat, start: np.ndarray) -> LazyNodes:
    """``Graph.nodes``: each :class:`Node` built from the columns on first access.

    The FX nodes are kept in an object array: the cyclic garbage collector does not scan
    arrays, and a list of a million nodes would be scanned at every collection of the
    generation it is in (the graph keeps the nodes alive anyway)."""
    fx_nodes = np.fromiter(fx_nodes, dtype=object, count=len(fx_nodes))
    lists: list[list] = []

    def columns() -> list[list]:
        if not lists:
            lists.extend(np.asarray(c).tolist()
                         for c in (target_id, stack_id, tags_id, start, flat))
        return lists

    def make(i: int) -> Node:
        targets, stacks, tags, bounds, inputs = columns()
        fx_node = fx_nodes[i]
        return Node(i, fx_node.name, ops[i], target_text[targets[i]],
                    tuple(inputs[bounds[i]:bounds[i + 1]]), table[stacks[i]],
                    tag_values[tags[i]], is_io[i], fx_node)

    def make_all() -> list[Node]:
        targets, stacks, tags, bounds, inputs = columns()
        with gc_paused():
            every = list(table)  # each stack's tuple made once
            return [
                Node(i, n.name, op, target_text[t], tuple(inputs[a:b]), every[k],
                     tag_values[g], io, n)
                for i, (n, op, t, k, g, io, a, b) in enumerate(
                    zip(fx_nodes, ops, targets, stacks, tags, is_io, bounds, bounds[1:])
                )
            ]

    return LazyNodes(len(fx_nodes), make, make_all)


def from_graph_module(gm: torch.fx.GraphModule, *, source: Any = None,
                      split_calls: bool | None = None) -> Graph:
    """Build the IR of a GraphModule (``symbolic_trace``, ``ExportedProgram.module()``...)."""
    root_class = None
    if type(gm).__name__ != "GraphModule":
        root_class = class_name(type(gm))
    graph = from_fx_graph(gm.graph, source=source if source is not None else gm,
                          split_calls=split_calls)
    if graph.root_class is None and root_class is not None:
        from attrs import evolve

        graph = evolve(graph, root_class=root_class, columns=graph.columns)
    return graph


def from_exported_program(program: torch.export.ExportedProgram) -> Graph:
    """Build the IR of an exported program's graph (parameters are placeholders)."""
    return from_fx_graph(program.graph_module.graph, source=program)


__all__ = ["EMPTY_STACK_KEY", "EMPTY_TAGS", "class_name", "from_exported_program",
           "from_fx_graph", "from_graph_module", "gc_paused"]
